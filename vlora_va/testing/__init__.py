"""What the tests and the benchmarks share (never imported by the product itself):

    tiny.py        a tiny random-weight DINOv2 and adapters that fit it
    messages.py    the message generator of the fuzz test and bench/fuzz.py (its mutations)
    message_builder.py  what a generated message is, a valid header and its frames, a value breaking a field
    wire_schema.py the wire schema restated, independently of contracts/wire.py
    fuzz_sending.py    Sender (the books of what each message is owed), RowTail, the oversize cut-off check
    reference_rows.py  a detector whose rows carry detections; each task computed alone; payload comparison
    atmm_cases.py  the ATMM shapes every backend is checked on (tests/kernels, bench/gpu.py)
"""
