"""`python -m hf_tinytx.serve` (`tinytx serve`): transformers' OpenAI-compatible server behind our checks.

    __main__.py        the launcher: the model argument checked, both servers started, stop signals
    backend.py         transformers' own `Serve`, on a loopback port, with TinyTx's classes where it looks
                       them up
    front.py           the ASGI app clients reach: checks each request, forwards the good ones, cuts on a stop
    request_checks.py  what a request body may hold (types, ranges), and the HTTP 400 a bad one gets
    model_checks.py    the checks that need the model (prompt length, chat template), and the body forwarded
    answers.py         one streamed answer gathered, to end it early or to answer a client that did not stream
"""
