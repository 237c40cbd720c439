"""The `tidepool` subcommands, one small module each: its flags (`add`) and what it runs (`run`),
which builds the settings and calls the part of the package that owns the work."""

from tidepool.commands import (
    deploy_manifests,
    infer,
    install_backend,
    load,
    plan,
    profile,
    serve,
    status,
    sweep,
)

# In the order `tidepool --help` lists them.
ALL = (serve, install_backend, infer, sweep, load, profile, plan, status, deploy_manifests)
