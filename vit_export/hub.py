"""Models by name: a Hugging Face Hub repo id, or a timm name whose weights timm keeps on the
Hub, fetched by huggingface_hub into its standard cache (HF_HOME, shared with transformers
and timm) at a commit, and handed as a local folder to the same import as `--checkpoint`.

Only `config.json`, `preprocessor_config.json` and `model.safetensors` are fetched: a repo
that offers only pickled weights, or whose config needs its own code, is refused before any
weights are downloaded. Nothing is unpickled and no repo code runs.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from . import bundle as B
from .checkpoints.files import MAX_JSON_BYTES  # a repo's config files: as a folder's
from .checkpoints.hf import HF_MODEL_TYPES, hf_architecture
from .errors import BundleError, CheckpointError, ConfigError, HubError, first_line, param, raw
from .errors import shown as escaped
from .frameworks import HF_MODULE_TYPES, TIMM_MODULES, framework_builds, timm_home
from .verified import open_checked, read_once

CONFIG, PROCESSOR, WEIGHTS = "config.json", "preprocessor_config.json", "model.safetensors"
SHARDED = "model.safetensors.index.json"
PICKLED = (".bin", ".pth", ".pt", ".ckpt", ".pkl", ".pickle")
TIMM_HUB = "hf-hub:"
# What a name can be, for `export --help` and the errors below.
_BUILT_AS_THEY_ARE = ", ".join(t for t in HF_MODULE_TYPES if t not in HF_MODEL_TYPES)
FAMILIES = (f"a Hub repo id of a transformers image model ({', '.join(HF_MODEL_TYPES)}; "
            f"and, as transformers builds them, {_BUILT_AS_THEY_ARE}), or a timm vision "
            f"transformer's name with its pretrained tag (or hf-hub:timm/NAME)")
# Where timm's preprocessing is read by resolve_data_config: a repo's pretrained_cfg must agree
# with timm's own for the name, as the bundle's preprocessing is timm's.
TIMM_DATA_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


@dataclass(frozen=True)
class Fetched:
    """A named model in the Hugging Face cache, pinned to the commit its revision resolved to."""
    name: str  # as asked, without the revision
    repo: str  # the Hub repo id
    revision: str  # as asked (default: main)
    commit: str  # what it resolved to
    folder: Path  # the cache's snapshot folder of that commit
    files: dict[str, str]  # each fetched file -> its sha256
    timm_name: Optional[str] = None  # `arch.tag` for timm's weights, else None (transformers)

    def record(self) -> dict[str, Any]:
        """What config.json keeps under `hub`."""
        record = {"repo": self.repo, "revision": self.revision, "commit": self.commit,
                  "files": self.files}
        if self.timm_name:
            record["timm_name"] = self.timm_name
        return record


# A revision is a commit hash or a ref name (a branch, a tag, refs/pr/N) as git allows one:
# no part that is empty, "." or ".." or starts with a dot, nothing but these characters.
# huggingface_hub reads an offline revision as a path under the cache's refs/ folder:
# `@../../x` read another file as the commit, and the snapshot from where that file said.
REVISION = re.compile(r"[0-9A-Za-z_+=-][0-9A-Za-z._+=-]*(/[0-9A-Za-z_+=-][0-9A-Za-z._+=-]*)*")


def parse_name(text: str) -> tuple[str, str]:
    """NAME[@REVISION] -> (NAME, REVISION or main); a repo id never holds an @.

    Raises:
        HubError: no name, or a revision that is no commit hash or ref name (`REVISION`).
    """
    name, at, revision = text.partition("@")
    if not name or (at and not revision) or "@" in revision:
        raise HubError(f"{param('model', text)}: expected NAME or NAME@REVISION")
    if at and (not REVISION.fullmatch(revision) or revision.endswith(".lock")):
        raise HubError(f"{param('model', text)}: revision {revision!r} is not a commit hash or a "
                       f"ref name (a branch or tag, without '.' or '..' parts)")
    return name, revision or "main"


def _timm_repo(name: str) -> tuple[str, str]:
    """The Hub repo and `arch.tag` of a timm name (vit_base_patch16_224.augreg2_in21k_ft_in1k)."""
    try:
        from timm.models import get_pretrained_cfg
    except ImportError:
        raise HubError(f"{name!r} is not a Hub repo id (owner/name), and timm, which would know "
                       f"it as a model name, is not installed") from None
    try:
        cfg = get_pretrained_cfg(name, allow_unregistered=False)
    except RuntimeError:
        cfg = None
    if cfg is None:
        raise HubError(f"{name!r} is neither a Hub repo id (owner/name) nor a timm model with "
                       f"pretrained weights; a name can be {FAMILIES}")
    full = f"{cfg.architecture}.{cfg.tag}" if cfg.tag else cfg.architecture
    if not cfg.hf_hub_id:
        raise HubError(f"timm keeps no weights for {full} on the Hugging Face Hub")
    if cfg.hf_hub_filename not in (None, "pytorch_model.bin", WEIGHTS):
        raise HubError(f"timm loads {full} from {cfg.hf_hub_filename}, another framework's "
                       f"layout, not timm's own weights; not supported")
    return cfg.hf_hub_id, full


def _token_source() -> Optional[str]:
    from huggingface_hub import get_token

    if os.environ.get("HF_TOKEN"):
        return "the token in HF_TOKEN"
    return "your saved Hub token (hf auth login)" if get_token() else None


def _not_cached(exc: Exception, named: str) -> HubError:
    """Why a snapshot that is not in the cache could not be downloaded: offline mode, a
    refused token, or a Hub out of reach."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    endpoint, cache = constants.ENDPOINT, constants.HF_HUB_CACHE
    if constants.is_offline_mode():
        return HubError(f"{named} is not in the Hugging Face cache ({cache}) and "
                        f"HF_HUB_OFFLINE=1 forbids downloading it; run once online, or "
                        f"unset HF_HUB_OFFLINE")
    cause = exc.__cause__ or exc
    if isinstance(cause, HfHubHTTPError) and cause.response.status_code == 401:
        return HubError(f"the Hub at {endpoint} refused {_token_source()} (invalid "
                        f"credentials, HTTP 401)")
    return HubError(f"cannot reach the Hub at {endpoint} ({type(cause).__name__}: "
                    f"{first_line(cause)}) and {named} is not in the Hugging Face cache "
                    f"({cache})")


def _http_error(exc, named: str, what: str) -> HubError:
    """An HTTP error of the Hub as one line: a refused token, a client error, or a download
    broken off by the server (run again)."""
    from huggingface_hub import constants

    endpoint, status = constants.ENDPOINT, exc.response.status_code
    if status == 401:
        return HubError(f"the Hub at {endpoint} refused {_token_source()} (invalid "
                        f"credentials, HTTP 401)")
    if status < 500:
        return HubError(f"the Hub at {endpoint} answered HTTP {status} for {named}: "
                        f"{first_line(exc)}")
    return HubError(f"downloading {what} of {named} broke off (HTTP {status} from "
                    f"{endpoint}); no partial file is kept; run the same command again")


def _download(repo: str, revision: str, patterns: list[str], shown: bool) -> Path:
    """huggingface_hub's snapshot_download of the files matching `patterns`, its errors as
    one line each."""
    import httpx2
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    named = f"{repo}@{revision}"
    what = " and ".join(p for p in patterns)
    try:
        with _client(shown):
            return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except GatedRepoError as exc:
        token = _token_source()
        why = f"{token} has not been granted access" if token else "no token was given"
        raise HubError(f"{repo} is gated ({why}, HTTP {exc.response.status_code}): accept its "
                       f"terms at {endpoint}/{repo} and set HF_TOKEN to a token of that "
                       f"account") from None
    except RepositoryNotFoundError:
        token = _token_source()
        why = f"{token} cannot read it" if token else "no token was given: set HF_TOKEN"
        raise HubError(f"{repo} is not on {endpoint}, or it is private and {why}") from None
    except RevisionNotFoundError:
        raise HubError(f"{repo} has no revision {revision!r} (a branch, tag or commit)") from None
    except IncompleteSnapshotError:
        raise HubError(f"the cached copy of {named} lacks part of {what} (an interrupted "
                       f"download?) and the Hub is out of reach; run again online to complete "
                       f"it") from None
    except LocalEntryNotFoundError as exc:
        raise _not_cached(exc, named) from None
    except HfHubHTTPError as exc:
        raise _http_error(exc, named, what) from None
    except (httpx2.TransportError, OSError) as exc:
        raise HubError(f"downloading {what} of {named} broke off ({type(exc).__name__}: "
                       f"{first_line(exc)}); no partial file is kept; run the same command "
                       f"again") from None


@contextmanager
def _client(shown: bool) -> Iterator[None]:
    """huggingface_hub's download bars on stderr while `shown`, else none; its log records
    (a retried download, say) through the root logger, which the application configures,
    instead of the stderr handler huggingface_hub installs on its own logger."""
    import logging

    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    (enable_progress_bars if shown else disable_progress_bars)()
    logger = logging.getLogger("huggingface_hub")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers, logger.propagate = [], True
    logger.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        (disable_progress_bars if was_disabled else enable_progress_bars)()
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])


def _read_json(folder: Path, name: str, repo: str) -> dict[str, Any]:
    """A cached config file as strict JSON (B.parse_json: no NaN, no nesting too deep to
    parse) of at most MAX_JSON_BYTES, or HubError in one line."""
    try:
        data = read_once(folder / name, limit=MAX_JSON_BYTES).data
    except BundleError as exc:
        raise HubError(f"{repo}: cannot read its {name}: {raw(exc)}") from None
    doc = B.parse_json(data, f"{repo}: its {name}", HubError, unique_keys=False)
    if not isinstance(doc, dict):
        raise HubError(f"{repo}: its {name} is not a JSON object")
    return doc


def _repo_files(repo: str, commit: str, folder: Path) -> list[str]:
    """The files of `repo` at `commit`, from the listing snapshot_download cached."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return [f.path for f in get_cached_repo_tree(repo, revision=commit)]
    except CachedRepoTreeNotFoundError:  # a cache filled before trees were kept: what is there
        return [p.relative_to(folder).as_posix() for p in folder.rglob("*")]


def _check_weights(repo: str, files: list[str]) -> None:
    if WEIGHTS in files:
        return
    if SHARDED in files:
        raise HubError(f"{repo} splits its weights into shards ({SHARDED}); only a single "
                       f"{WEIGHTS} is supported")
    pickled = sorted(f for f in files if f.endswith(PICKLED))
    if pickled:
        raise HubError(f"{repo} offers only pickled weights ({', '.join(pickled)}), no "
                       f"{WEIGHTS}; vit-export reads safetensors only and never unpickles a "
                       f"download")
    raise HubError(f"{repo} holds no {WEIGHTS}")


def _check_family(repo: str, folder: Path, timm_name: Optional[str]) -> Optional[str]:
    """The timm `arch.tag` of a timm repo (None for transformers), once the repo is known to
    be a family we build and to need no code of its own: before its weights are fetched."""
    config = _read_json(folder, CONFIG, repo)
    docs = [(CONFIG, config)] + ([(PROCESSOR, _read_json(folder, PROCESSOR, repo))]
                                 if (folder / PROCESSOR).is_file() else [])
    for name, doc in docs:
        if doc.get("auto_map") or doc.get("trust_remote_code"):
            classes = ", ".join(sorted(map(str, (doc.get("auto_map") or {}).values())))
            raise HubError(f"{repo}'s {name} needs the repo's own code "
                           f"({classes or 'trust_remote_code'}); vit-export never runs remote "
                           f"code")
    try:
        if "model_type" in config:
            if not framework_builds({CONFIG: config}, None):  # else: as transformers builds it
                hf_architecture(config)  # refuses a model type we do not build, naming it
            return None
        if "architecture" in config:
            return _timm_name(repo, config, timm_name)
    except (CheckpointError, ConfigError) as exc:
        raise HubError(f"{repo}: {exc}") from None
    raise HubError(f"{repo}'s {CONFIG} has neither a transformers model_type nor a timm "
                   f"architecture; a name can be {FAMILIES}")


def _timm_name(repo: str, config: dict[str, Any], asked: Optional[str]) -> str:
    """The `arch.tag` a timm repo's config.json names, checked against timm's own config."""
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    from .checkpoints import named_architecture

    cfg = config.get("pretrained_cfg") if isinstance(config.get("pretrained_cfg"), dict) else {}
    arch, tag = config["architecture"], cfg.get("tag")
    name = asked or (f"{arch}.{tag}" if tag else str(arch))
    try:
        known = get_pretrained_cfg(name, allow_unregistered=False)
    except RuntimeError:
        known = None
    if known is None:
        raise HubError(f"{repo}: timm has no pretrained config {name!r} to build it with")
    if timm_home(name) in TIMM_MODULES and _framework_road(repo, name, config):
        return name  # built as timm builds it: its registered model, nothing to compare
    ours = named_architecture(name)  # refuses what we do not build (a ResNet), naming it
    theirs = _timm_args_architecture(repo, str(arch), name, config.get("model_args"))
    differ = [f"{key} {theirs.get(key)} (timm's {name}: {ours.get(key)})"
              for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]
    if differ:  # the import builds timm's registered model; the weights show sizes, not these
        raise HubError(f"{repo}'s {CONFIG} builds {arch} with model_args that change its "
                       f"architecture: {', '.join(differ)}; not supported")
    timm_data = resolve_data_config(pretrained_cfg=known.to_dict())
    repo_data = resolve_data_config(pretrained_cfg={**known.to_dict(), **cfg})
    differ = [f"{key} {repo_data[key]} (timm: {timm_data[key]})" for key in TIMM_DATA_KEYS
              if _plain(repo_data[key]) != _plain(timm_data[key])]
    if differ:
        raise HubError(f"{repo}'s pretrained_cfg preprocesses otherwise than timm's {name}: "
                       f"{', '.join(differ)}")
    return name


def _framework_road(repo: str, name: str, config: dict[str, Any]) -> bool:
    """Whether a timm repo's model takes the framework road (the rebuild refuses it), where
    the import builds timm's registered model as it is: a repo whose model_args change it
    is refused."""
    from .checkpoints import named_architecture

    try:
        named_architecture(name)
        return False
    except (CheckpointError, ConfigError):
        pass
    if config.get("model_args"):
        raise HubError(f"{repo}'s {CONFIG} builds {name} with model_args "
                       f"({', '.join(map(str, config['model_args']))}); a model vit-export "
                       f"exports as timm builds it is timm's registered one")
    return True


def _plain(value: Any) -> Any:
    """A JSON list and timm's tuple alike."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _timm_args_architecture(repo: str, arch: str, name: str, model_args: Any) -> dict[str, Any]:
    """What timm builds from a repo's model_args (timm's saving records them: img_size,
    num_classes, global_pool, ...), read as named_architecture reads the registered model."""
    from .checkpoints import named_architecture, timm_architecture

    if not model_args:
        return named_architecture(name)
    if not isinstance(model_args, dict):
        raise HubError(f"{repo}'s {CONFIG}: model_args is not a JSON object")
    refused = sorted(k for k, v in model_args.items() if k not in TIMM_MODEL_ARGS
                     or not _plain_value(v))
    if refused:  # checkpoint_path loads a file, pretrained_cfg_overlay names one, ...
        raise HubError(f"{repo}'s {CONFIG}: model_args {refused[0]!r} is not one vit-export "
                       f"passes to timm (it passes sizes and switches only: "
                       f"{', '.join(sorted(TIMM_MODEL_ARGS))})")
    import timm
    import torch

    try:
        with torch.device("meta"):
            model = timm.create_model(arch, pretrained=False, **model_args)
    except Exception as exc:  # timm's errors for arguments its model does not take
        raise HubError(f"{repo}: timm cannot build {arch} with its model_args: "
                       f"{first_line(exc)}") from None
    return timm_architecture(model, name)


# What a repo's model_args may pass to timm.create_model: the architecture's sizes and
# switches (timm's VisionTransformer and Eva keyword arguments), each a number, string,
# boolean or a list of them. Nothing that names a file or a class (checkpoint_path,
# pretrained_cfg_overlay, act_layer, ...) passes.
TIMM_MODEL_ARGS = frozenset({
    "img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
    "num_heads", "mlp_ratio", "qkv_bias", "qk_norm", "init_values", "class_token",
    "no_embed_class", "reg_tokens", "num_reg_tokens", "pre_norm", "final_norm", "fc_norm",
    "dynamic_img_size", "dynamic_img_pad", "drop_rate", "pos_drop_rate", "patch_drop_rate",
    "proj_drop_rate", "attn_drop_rate", "drop_path_rate", "qkv_fused", "swiglu_mlp",
    "scale_mlp", "scale_attn_inner", "use_abs_pos_emb", "use_rot_pos_emb", "use_post_norm",
    "ref_feat_shape", "head_init_scale", "attn_pool_num_heads", "attn_pool_mlp_ratio",
    "pos_embed", "weight_init", "fix_init"})


def _plain_value(value: Any) -> bool:
    """A JSON number, string, boolean or null, or a list of them."""
    if isinstance(value, list):
        return all(_plain_value(v) and not isinstance(v, list) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_repo_id(repo: str, text: str) -> None:
    """HubError, one line, for a repo id the Hub client refuses (`a/b/c`, `../../x`, a
    space, `hf-hub:` alone), by the client's own rule, before any request."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise HubError(f"{param('model', escaped(text))}: {escaped(repo)} is not a Hub repo id "
                       f"(owner/name): {first_line(exc)}") from None


def fetch(text: str, shown: bool = False) -> Fetched:
    """Fetch NAME[@REVISION] into the Hugging Face cache: its configs first (the commit is
    resolved, remote code, pickle-only repos and families we do not build are refused), then
    model.safetensors at that commit. `shown`: huggingface_hub's progress bars on stderr."""
    name, revision = parse_name(text)
    timm_name = None
    repo = name
    if name.startswith(TIMM_HUB):
        repo = name[len(TIMM_HUB):]
    elif "/" not in name:
        repo, timm_name = _timm_repo(name)
    _check_repo_id(repo, text)
    folder = _download(repo, revision, [CONFIG, PROCESSOR], shown)
    commit = folder.name
    if not re.fullmatch(r"[0-9a-f]{40}", commit):  # offline, read from the cache's refs/
        raise HubError(f"{repo}@{revision} resolved to {commit[:60]!r} in the Hugging Face "
                       f"cache, which is not a commit hash")
    if not (folder / CONFIG).is_file():
        raise HubError(f"{repo} has no {CONFIG}; a name can be {FAMILIES}")
    _check_weights(repo, _repo_files(repo, commit, folder))
    timm_name = _check_family(repo, folder, timm_name)
    folder = _download(repo, commit, [WEIGHTS], shown)
    listed = _listing(repo, commit)
    files = {f: _checked_config(repo, commit, folder / f, listed.get(f))
             for f in (CONFIG, PROCESSOR) if (folder / f).is_file()}
    files[WEIGHTS] = _checked_weights(repo, commit, folder, listed.get(WEIGHTS))
    return Fetched(name, repo, revision, commit, folder, files, timm_name)


def _listing(repo: str, commit: str) -> dict[str, Any]:
    """The repo's files at `commit` as the Hub listed them (path -> RepoFile, with its git
    blob id and, for an LFS file, its sha256), from the listing snapshot_download cached;
    empty for a cache filled before listings were kept."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return {f.path: f for f in get_cached_repo_tree(repo, revision=commit)}
    except CachedRepoTreeNotFoundError:
        return {}


def _checked_config(repo: str, commit: str, path: Path, entry: Any) -> str:
    """The sha256 of a cached config file, whose bytes must be the git blob the Hub listed
    for it (where the listing was kept)."""
    try:
        data = read_once(path, limit=MAX_JSON_BYTES).data
    except BundleError as exc:
        raise HubError(f"{repo}: cannot read its {path.name}: {raw(exc)}") from None
    blob = getattr(entry, "blob_id", None)
    if isinstance(blob, str) and getattr(entry, "lfs", None) is None and blob != \
            hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest():
        raise HubError(f"the cached {path.name} of {repo}@{commit} is not the file the Hub "
                       f"lists (git blob {blob[:12]}...): a damaged or altered download; "
                       f"remove {path.parent} from the cache and run again")
    return hashlib.sha256(data).hexdigest()


def _checked_weights(repo: str, commit: str, folder: Path, entry: Any) -> str:
    """The sha256 of the cached model.safetensors, which must be a regular file (a symlink
    to one, as the cache keeps it) whose bytes hash to the sha256 the Hub gave for it: its
    LFS oid in the repo's cached listing, else the ETag the cache names its blob by."""
    path = folder / WEIGHTS
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        mode = None
        why = exc.strerror
    if mode is None or not stat.S_ISREG(mode):
        kind = why if mode is None else "a folder" if stat.S_ISDIR(mode) else "not a file"
        raise HubError(f"the cached {WEIGHTS} of {repo}@{commit} is not a regular file "
                       f"({kind}): vit-export reads no other weights; remove "
                       f"{folder} from the cache and run again")
    digest = _sha256(path)
    listed = _hub_sha256(entry, path)
    if listed is None:
        raise HubError(f"the Hub gave no sha256 for {repo}'s {WEIGHTS} at {commit} (not an LFS "
                       f"file), so the download cannot be checked")
    if digest != listed:
        raise HubError(f"the cached {WEIGHTS} of {repo}@{commit} does not match the sha256 the "
                       f"Hub lists for it ({digest[:12]}... is not {listed[:12]}...): a damaged "
                       f"or altered download; remove {folder} from the cache and run again")
    return digest


def _hub_sha256(entry: Any, path: Path) -> Optional[str]:
    """The sha256 the Hub gave for a file: its LFS oid in the listing (`_listing`), else the
    name of the blob the cache links it to (the Hub's X-Linked-Etag, which for an LFS file
    is its sha256)."""
    lfs = getattr(entry, "lfs", None)
    if lfs is not None and re.fullmatch(r"[0-9a-f]{64}", str(lfs.sha256)):
        return str(lfs.sha256)
    blob = os.path.realpath(path).rsplit("/", 1)[-1]
    return blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None


@contextmanager
def _checked_folder(fetched: Fetched) -> Iterator[Path]:
    """A folder of links to the files `fetch` checked, and nothing else: the import reads a
    folder's pytorch_model.bin where it finds no model.safetensors, and the cache's snapshot
    folder may hold one (another download, another tool). Each link names the file as it is
    open here, hashed again to what `fetch` recorded (`verified.open_checked`): one renamed
    into the cache meanwhile is not read."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vx-hub-") as tmp, ExitStack() as stack:
        for name, sha256 in fetched.files.items():
            try:
                opened = stack.enter_context(open_checked(fetched.folder / name, sha256))
            except BundleError as exc:
                raise HubError(f"{fetched.repo}@{fetched.commit}: {raw(exc)}") from None
            os.symlink(opened, Path(tmp) / name)
        yield Path(tmp)


def load_named(text: str, overrides: Optional[dict[str, Any]] = None, shown: bool = False):
    """Our model, its description and the files it was built from (`CheckpointFiles`, read
    once: what source parity builds transformers' or timm's own model from) from
    NAME[@REVISION] on the Hub, through the same import as a local checkpoint folder; the
    description records the repo, revision, commit and each fetched file's sha256 (under
    `hub`), and no path of this machine's cache."""
    from .checkpoints import load_checkpoint, read_checkpoint

    fetched = fetch(text, shown)
    with _checked_folder(fetched) as folder:
        files = read_checkpoint(folder)
        model, description = load_checkpoint(
            files, fmt="timm" if fetched.timm_name else "hf", overrides=overrides,
            timm_name=fetched.timm_name)
    imported = {**description.extra.get("import", {}),
                "checkpoint": f"{fetched.repo}@{fetched.commit}"}
    name = fetched.timm_name or fetched.repo.rsplit("/", 1)[-1]
    return model, replace(description, name=name, extra={
        **description.extra, "import": imported, "hub": fetched.record()}), files
