"""gazctl, the command-line tool (`gazette.gazctl.__main__`)."""
