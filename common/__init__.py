"""What every app of the service shares, on the bottom floor (it imports no app): guards
(URL passwords masked, throttles of wrong secrets and logins, generated secrets, a private
``STATE_DIR``), process plumbing (a child dies with its parent, one process per
``STATE_DIR``), one-at-a-time checks, and identifiers that wrap on a page."""
