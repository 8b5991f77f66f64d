"""Reference servers and launchers for real hardware (not part of the installed loadtest package)."""
