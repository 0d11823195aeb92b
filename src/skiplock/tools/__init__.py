"""Tools run from the command line: ``skiplock demo`` (:mod:`.demo`) and ``skiplock scenario``
(:mod:`.scenario`). Not part of the public API."""
