"""vlora-va: real-time video analytics with one backbone and many LoRA adapters."""
__version__ = "0.1.0"
