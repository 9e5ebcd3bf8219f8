"""A stand-in for `strands_tools` (strands-agents-tools) with the one tool ART's example imports, `calculator`: the
real package pins pillow<13, which the dev environment's matplotlib pin (pillow 13) rules out."""
