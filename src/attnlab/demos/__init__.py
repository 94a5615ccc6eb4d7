"""The seed reproductions: the experiments of the five seeds, run on attnlab's own parts.

`averaging.py` is seed 004's three ways to average each token with the ones before it;
`attnlab demo` (cli/demo.py) trains and draws seed 002's hello and animals models.
"""
