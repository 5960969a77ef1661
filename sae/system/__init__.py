"""The ground floor, standard library only: files (:mod:`sae.system.io`) and what every command
shares as a process (:mod:`sae.system.process`)."""
