"""Where reports are written: the run directory (``rundir``), the terminal text
(``text``), JUnit XML (``junit``) and plots (``plot``)."""
