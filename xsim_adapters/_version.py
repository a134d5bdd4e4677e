"""The package version, in a module of its own so that any layer (the output stamp in
:mod:`._outdir`, ``xsim --version``) reads it without importing the API."""

__version__ = "0.1.0"
