"""Does every exported artifact compute what eager PyTorch computes? Returns data, never prints.

`validate(bundle)` rebuilds eager PyTorch from weights.safetensors + config.json, runs it, the
TorchScript file and every ONNX model of the bundle (plain, optimized, fp16, int8) on the same
seeded inputs at batch sizes that prove the batch axis is dynamic, compares logits pair by
pair under each model's tolerance profile, and scans the ONNX graph for a batch size baked
into a shape constant. With `ValidateOptions(layers=True)` it also compares the intermediate
tensors stage by stage and names the first stage that diverges.

Polygraphy's split, one module per job: runners are built by `runtime.open_runners`; `inputs`
says what they are fed; `run_bundle` runs them (the run stage collects each runner's whole
outputs) into a `runs.RunResult`, data that `saved` keeps as an .npz and reads back;
`compare` judges whole input sets, whole runs, and one run against another under a
`tolerance` profile (pure functions); `checks` reads the artifacts themselves; `stages` finds
the first diverging stage; `e2e` checks preprocessing end to end; `validate` ties run,
compare and checks together; `report` holds what was found (`proof` reads a parity.json back: what it proves of a bundle), and `render` turns it into
text, Markdown or JUnit.
"""
from ..lazy import lazy_names
from .compare import (
    MIN_NEIGHBOUR_IMAGES,
    NEIGHBOUR_TIE,
    NEIGHBOURS,
    PairResult,
    comparable,
    compare,
    compare_pair,
    compare_run,
    compare_runs,
    compare_sets,
    cosines,
    neighbour_agreement,
)
from .inputs import (
    OTHER_SIZE_BATCH,
    REAL_DATA_BATCH,
    FileInputs,
    ImageSet,
    InputSet,
    default_batch_sizes,
    input_sets,
    inputs_from_files,
    labelled_inputs,
    validation_sizes,
)
from .runs import (
    RunnerRecord,
    RunResult,
    input_digest,
    set_digest,
)
from .tolerance import (
    PROFILES,
    Tolerance,
    precision_of_profile,
    profile_tolerance,
)

# The rest load with their module when first asked for: reading a parity.json (`proof`)
# needs no torch, and `vit-export info` should not pay for it.
_HOMES = {
    "Check": "report",
    "E2E_REFERENCE": "e2e",
    "PARITY_KINDS": "proof",
    "ParityReport": "report",
    "QUANTIZED_OPS": "checks",
    "SourceAhead": "ahead",
    "StageResult": "report",
    "ValidateOptions": "validation",
    "compare_e2e": "e2e",
    "compare_stages": "stages",
    "e2e_images": "e2e",
    "eager_stages": "stages",
    "first_divergence": "stages",
    "graph_precision": "checks",
    "judge_runs": "validation",
    "judged_profiles": "checks",
    "labelled_accuracy": "proof",
    "load_run": "saved",
    "onnx_stage_values": "stages",
    "onnx_stages": "stages",
    "passed_runners": "proof",
    "pipeline_check": "e2e",
    "placement_check": "checks",
    "program_stages": "stages",
    "read_parity": "proof",
    "read_proof": "proof",
    "refuse_bundle_files": "saved",
    "run_bundle": "validation",
    "run_e2e": "e2e",
    "run_stage": "validation",
    "run_stages": "stages",
    "save_run": "saved",
    "scan_graph": "checks",
    "scan_program": "checks",
    "stage_names": "stages",
    "unseen_batch_check": "checks",
    "validate": "validation",
    "validated_device": "proof",
    "validated_runners": "proof",
}

__all__ = [
    "E2E_REFERENCE", "MIN_NEIGHBOUR_IMAGES", "NEIGHBOURS", "NEIGHBOUR_TIE", "OTHER_SIZE_BATCH",
    "PARITY_KINDS", "PROFILES", "QUANTIZED_OPS", "REAL_DATA_BATCH", "Check", "FileInputs",
    "ImageSet", "InputSet", "PairResult", "ParityReport", "RunResult", "RunnerRecord",
    "SourceAhead", "StageResult", "Tolerance", "ValidateOptions", "comparable", "compare", "compare_e2e",
    "compare_pair", "compare_run", "compare_runs", "compare_sets", "compare_stages", "cosines",
    "default_batch_sizes", "e2e_images", "eager_stages", "first_divergence", "graph_precision",
    "input_digest", "input_sets", "inputs_from_files", "judge_runs", "judged_profiles",
    "labelled_accuracy", "labelled_inputs", "load_run", "neighbour_agreement",
    "onnx_stage_values", "onnx_stages",
    "passed_runners", "pipeline_check", "placement_check", "precision_of_profile",
    "profile_tolerance", "program_stages", "read_parity", "read_proof", "refuse_bundle_files",
    "run_bundle", "run_e2e", "run_stage", "run_stages", "save_run", "scan_graph",
    "scan_program", "set_digest", "stage_names", "unseen_batch_check", "validate",
    "validated_device", "validated_runners", "validation_sizes",
]

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
