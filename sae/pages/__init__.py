"""Pages: the shared HTML rendering (:mod:`~sae.pages.html`), a run's report
(:mod:`~sae.pages.report`), its feature browser (:mod:`sae.pages.features`) and the gallery
(:mod:`~sae.pages.gallery`)."""
