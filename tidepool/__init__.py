"""The `tidepool` command: one subcommand per job, each a thin call into the package that owns it."""
