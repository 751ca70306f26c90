"""Where a bundle goes to work: answers in one process (`classify`), the Open Inference
Protocol as data (`oip`), a Triton Inference Server model repository (`triton`), and the Ray
wing (`ray`: Ray Serve, Ray Data, and Ray's process rules). The core (export, parity,
runtime) imports nothing from here, and nothing here imports Ray until it runs."""

# The largest batch a server forms from waiting requests: serve's replicas and Triton's
# dynamic batcher, one default for both.
DEFAULT_MAX_BATCH_SIZE = 16
# What the servers' numbers may be, for their flags and their Python callers alike
INT32_MAX = 2 ** 31 - 1  # Triton's max_batch_size and instance count are int32
PORT_RANGE = (1, 65535)
BATCH_WAIT_MS_RANGE = (0, 10_000)
