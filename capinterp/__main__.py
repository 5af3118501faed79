"""``python -m capinterp`` runs the command line (the same as the ``capinterp`` script)."""

from capinterp.app.cli import main

raise SystemExit(main())
