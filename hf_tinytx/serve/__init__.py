"""`python -m hf_tinytx.serve` (`tinytx serve`): transformers' OpenAI-compatible server, requests checked.

    __main__.py        the launcher: the model argument checked, transformers' `Serve` run, stop signals
    request_checks.py  what a request body may hold (types, ranges), and the HTTP 400 a bad one gets
    guard.py           what the launcher puts around transformers' server
"""
