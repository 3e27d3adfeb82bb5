"""The engine: one backbone with adapters in LoRA slots and their heads, executing batch plans.

    executor.py      Engine: adapters in slots, mode switches, a plan's forwards and heads -> typed results
    plan.py          BatchPlan / Catalog: what the scheduler decides and the engine executes
    backends/        what runs a plan's backbone forward (BackboneBackend; "torch")
    heads/           vision task heads (Head; detection, action)
    modes.py         LoRAMode (premerged / unmerged / merged / mixture), DeviceLayout
    lora.py          LoRA slot stacks in the backbone's linear layers, computed as the mode says (ATMM)
    cuda_graphs.py   captured forwards per plan key (GPU)
    precision.py     fp32 / bf16 / int8: what the machine runs, the int8 layers
    precision_choice.py  how `daemon.precision: auto` picks one (accuracy gate, measured speeds)
    precision_speeds.py  auto's candidates measured (which backend computes each), the cache of speeds and choice
    backbones.py     loading backbones (model cache, Hugging Face ids), the two layer namings
    vit.py           a ViT's structure (blocks, LayerScale folding)
    adapters.py      the adapter format (PEFT LoRA + head), read and written
    motion.py        the motion rule that names a person's activity from their boxes
"""
