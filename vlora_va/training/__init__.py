"""Adapter generation (offline): teachers → pseudo-labels → LoRA + task heads → fused adapters.

Modules, one concept each:
  frames      decode video frames at chosen times; the model preprocessing (letterbox + ImageNet norm)
  augment     zoomed-in crops of training frames (scale augmentation for detection)
  teachers    label sources (CenterNet ONNX with a class filter, optionally on tiles; HOG, Haar, COCO JSON,
              clip manifest) + cache
  corrections hand fixes of a teacher's boxes on named frames (and their crops), e.g. side-by-side people
  actions     the action-label source: activity derived from tracking teacher person boxes over a clip
  data        spec sources + video ranges -> labelled frames (detection) / labelled clips (action)
  features    frozen lower-layer feature cache; running the upper (LoRA) layers on top of it
  targets     detection training targets and losses
  train       LoRA (peft) + head training with checkpoints, resume and a time budget
  metrics     F1@IoU0.5, AP50, top-1, confusion matrix; against the human-checked set: recall by height,
              side-by-side pairs, recall at precision 0.9, per-activity recall
  evaluate    run an adapter on held-out footage and report
  fusion      greedy accuracy-aware knowledge fusion with rollback
  spec        the training spec (YAML) and its validation
  pipeline    one training run per adapter on cached data; runner: a whole spec (+ baselines, fusion, report)
  cards       adapter cards and the comparison report; draw: annotated frames
  cli         `vlora-va train SPEC.yaml` and `vlora-va eval ADAPTER --on VIDEO...`
Training-only dependencies (onnxruntime) are imported lazily.
"""
