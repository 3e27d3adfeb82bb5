"""What the tests and the benchmarks share (never imported by the product itself):

    tiny.py        a tiny random-weight DINOv2 and adapters that fit it
    messages.py    the message generator of the fuzz test and bench/fuzz.py, and its reference answers
    atmm_cases.py  the ATMM shapes every backend is checked on (tests/kernels, bench/gpu.py)
"""
