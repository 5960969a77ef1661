"""Settings, without torch: one setting (:mod:`~sae.settings.setting`), the registries of models
(:mod:`~sae.settings.variants`) and metrics (:mod:`~sae.settings.metric_defs`), every setting of a
run (:mod:`~sae.settings.config`) and the command line built from them
(:mod:`~sae.settings.cli`)."""
