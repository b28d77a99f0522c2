"""Read-only reports over outputs/: check, status, validate, diagnose, the HTML page."""
