"""What PyTorch's zip archives (model.pt2, model.aoti.pt2, model.ts) hold, read as zip files,
without handing them to the loaders that would run what is inside.

A bundle is data that travels: whoever opens one may not be whoever made it. The loaders of
these archives are not data readers. `torch.export.load` unpickles, with `weights_only=False`,
every weight or constant its payload config marks `use_pickle`, any custom or opaque object,
and sample inputs that fail the safe load; it loads the compiled code of any AOTInductor model
it finds; on a RuntimeError it tries the legacy format, which unpickles too. `torch.jit.load`
runs TorchScript. An AOTInductor package is a shared library. So the description each one
carries is read here from the zip itself, and `program_problem` reads a model.pt2's own index
(its members and payload configs, what the loader acts on) before torch may read it: our
export never writes a pickled entry, so one is refused whatever the bundle says.

Python's zipfile and torch's reader (miniz, in caffe2/serialize/inline_container.cc) find an
archive's members two ways: zipfile takes the central directory as lying just before the
end record and shifts every offset by any gap ("prepended data"), and reads the zip64 end
record just before its locator; miniz follows the recorded offsets and the locator wherever
they point. So an archive is read here only where every byte has one place (`_layout_problem`):
its members from offset 0, each local header matching its central-directory entry, one after
another, the central directory right after the last, the zip64 end record (torch's writer
always writes one) and its locator right after that, the end record last, with no comment.
Then the records both readers act on are the same records. Each field torch's reader
trusts (miniz's mz_zip_reader_read_central_dir, mz_zip_file_stat_internal, locate_file and
extract_to_mem, as PyTorch builds it) -> what holds it to Python's reading:

- end record, the last signature with 22 bytes after it -> its signature at size - 22 and
  no comment (zipfile tries exactly there first).
- end record's disk numbers; its entry count, directory size and offset -> disks 0; equal to
  the zip64 record's, or 0xFFFF / 0xFFFFFFFF.
- zip64 locator, the 20 bytes before the end record: the zip64 record's offset, its disk,
  the disk count -> the offset names the 56 bytes right before the locator (where zipfile
  reads the record, whatever the locator says); disk 0 of 1.
- zip64 record: its length, disks, entry counts, directory size and offset -> 44 (no
  extensible data: zipfile assumes none), disks 0, counts alike.
- directory at its recorded offset, of its recorded size -> offset + size is where the
  zip64 record (or the end record) begins: zipfile's "prepended data" shift is 0.
- directory's entry count, each entry's name, extra and comment lengths -> as many entries
  as zipfile read, filling the size exactly.
- entry's name bytes (found by a case-blind binary search) -> the UTF-8 of zipfile's name
  (no cp437 reading, no NUL cut); no two names equal but for case (`_index_problem`).
- entry's sizes and local header offset, from the first zip64 field where 0xFFFFFFFF ->
  zipfile's values; one zip64 field, present only where a value is 0xFFFFFFFF.
- entry's method, flags, folder bit (miniz reads no data of a folder), disk -> stored or
  deflated, no encryption or patch, not a folder, disk 0, no comment.
- entry's CRC-32: unchecked (PyTorch builds miniz with MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS)
  -> zipfile's, which checks it on what we read.
- local header's signature, name and extra lengths (where the data begins) -> it begins
  where the member before ends (byte 0 for the first), with the entry's name, method, flags
  and CRC and sizes (or zeros and a data descriptor after the data that holds them).
- data, the entry's compressed size from there -> the next local header, or the directory,
  follows it (after its data descriptor): no byte of the archive is left unread.

What miniz does not read (versions, times, attributes but the folder bit) neither reader
acts on. torch is handed the very bytes checked (`verified.read_once`), not an archive written
afresh from what zipfile read: torch's loaders take one (alignment unneeded), but it is a
second copy of the archive while torch loads it (a 378 MiB model.pt2: +378 MiB peak memory,
+0.3 s), where this check reads a few bytes per member (1 ms).
"""
from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any, Optional

from .errors import BundleError, first_line
from .verified import Loaded

METADATA_KEY = "vit_export"  # the description's key or file name in every archive
EXTRA_FILE = f"{METADATA_KEY}.json"  # ... as a torch.export / TorchScript extra file
# torch.export's archive layout (torch._C._export.pt2_archive_constants), under one root
AOTINDUCTOR_DIR = "data/aotinductor/"
WEIGHTS_DIR, CONSTANTS_DIR = "data/weights/", "data/constants/"
TENSOR_PREFIX = "tensor_"  # a constant stored as raw bytes (custom_obj_, opaque_obj_ pickle)
MODELS_DIR = "models/"
# What a program archive of ours holds, by folder: anything else is not read by us and may
# be read by the loader (executorch, MTIA, XL weights, ...)
PROGRAM_PARTS = ("models/", "data/weights/", "data/constants/", "data/sample_inputs/",
                 "extra/", ".data/", "archive_format", "archive_version", "byteorder")


# What an archive may declare, checked from its central directory before any member is read.
# torch.save, torch.export.save and torch.jit.save store tensors as they are; TorchScript
# deflates its code and debug tables, which shrink at most 5.5 times (a small vit_seed_tiny's
# model.ts, 63 kB of them). A member that inflates more than MAX_RATIO times, or compressed members
# inflating to more than MAX_INFLATED together, are not one of theirs: a zip bomb (a 0.3 MB
# model.pt2 whose sample inputs inflate to 64 MiB was read whole before).
MAX_RATIO = 64
MAX_INFLATED = 256 << 20
MAX_MEMBER_READ = 64 << 20  # what we read of one member ourselves: configs, sample inputs
Source = Path | Loaded  # a path, or a file's bytes as read once (`verified.read_once`)


def _where(source: Source) -> Path:
    return source.path if isinstance(source, Loaded) else Path(source)


def open_zip(source: Source) -> zipfile.ZipFile:
    """The zip archive at `source` (a path, or bytes read once), its central directory
    checked first (`_index_problem`) and then its layout (`_layout_problem`): one that
    Python's zipfile and torch's reader would read two ways, or that declares more than it
    can hold, is refused in one line."""
    path = _where(source)
    try:
        if isinstance(source, Loaded):
            archive, size = zipfile.ZipFile(io.BytesIO(source.data)), len(source.data)
        else:
            archive, size = zipfile.ZipFile(source), Path(source).stat().st_size
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise BundleError(f"cannot read {path}: not a PyTorch archive ({first_line(exc)})") \
            from None
    problem = _index_problem(archive.infolist(), size) or \
        _layout_problem(archive.fp, archive.infolist())
    if problem:
        archive.close()
        raise BundleError(f"{path} is refused before torch reads it: {problem}")
    return archive


def _index_problem(members: list[zipfile.ZipInfo], size: int) -> Optional[str]:
    """Why an archive's central directory cannot be read one way only, or None. Python's
    zipfile takes the last of two members of one name and matches names exactly; torch's
    reader (miniz) finds a name by a case-blind binary search, landing on either: so two
    names that are equal, or equal but for case, are refused outright. A stored member must
    declare its own size and lie inside the file; compressed ones are held to MAX_RATIO and
    MAX_INFLATED, all from the sizes declared, before anything is decompressed."""
    seen: dict[str, str] = {}
    inflated = 0
    for member in members:
        name = member.filename
        folded = name.casefold()
        if folded in seen:
            if seen[folded] == name:
                return f"it names {name} twice"
            return f"its members {seen[folded]} and {name} differ only in case"
        seen[folded] = name
        if member.compress_type == zipfile.ZIP_STORED:
            if member.file_size != member.compress_size or \
                    member.header_offset + member.compress_size > size:
                return (f"{name} declares {member.file_size} bytes stored in "
                        f"{member.compress_size}, in a file of {size}")
            continue
        inflated += member.file_size
        if member.file_size > max(MAX_RATIO * member.compress_size, 1 << 20) or \
                inflated > MAX_INFLATED:
            return (f"{name} declares {member.file_size} bytes inflated from "
                    f"{member.compress_size} (a zip bomb: more than {MAX_RATIO} times, or "
                    f"{MAX_INFLATED >> 20} MiB in all)")
    return None


# The zip records as APPNOTE.TXT lays them out, little-endian, each with its signature
_LOCAL = struct.Struct("<4s5H3I2H")  # local header: flags, method, time, date, CRC, sizes, lengths
_CENTRAL = struct.Struct("<4s6H3I5H2I")  # directory entry: ... lengths, disk, attributes, offset
_END = struct.Struct("<4s4H2IH")  # end record: disks, entries, directory size and offset, comment
_END64 = struct.Struct("<4sQ2H2I4Q")  # zip64 end record: its length, disks, entries, size, offset
_LOCATOR = struct.Struct("<4sIQI")  # zip64 locator: its disk, the zip64 record's offset, disks
_DESCRIPTOR = struct.Struct("<4s3I")  # after a member's data: CRC, sizes (zip64: 8 bytes each)
_DESCRIPTOR64 = struct.Struct("<4sIQQ")
LOCAL_SIG, CENTRAL_SIG, END_SIG = b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06"
END64_SIG, LOCATOR_SIG, DESCRIPTOR_SIG = b"PK\x06\x06", b"PK\x06\x07", b"PK\x07\x08"
ZIP64_FIELD = 0x0001  # the extra field that holds sizes and offsets of 0xFFFFFFFF
HAS_DESCRIPTOR, UTF8_NAME = 0x0008, 0x0800
# General-purpose flags both readers read alike: deflate's level (bits 1-2), a data
# descriptor, a UTF-8 name. Encryption, patches and masked headers are refused.
READ_ALIKE_FLAGS = 0x0006 | HAS_DESCRIPTOR | UTF8_NAME
DOS_DIRECTORY = 0x10  # miniz reads no data of a member with this attribute: torch gets junk
MAX32, MAX16 = 0xFFFFFFFF, 0xFFFF
SAME_READING = "(a second reader could read another one)"


class _CutShort(Exception):
    """A record runs past the end of the archive."""


def _read_at(fp, offset: int, n: int) -> bytes:
    """`n` bytes of the open archive `fp` at `offset`."""
    if offset < 0:
        raise _CutShort
    fp.seek(offset)
    data = fp.read(n)
    if len(data) != n:
        raise _CutShort
    return data


def _extra_fields(extra: bytes) -> Optional[list[tuple[int, bytes]]]:
    """An extra field's (id, data) records, or None where their lengths do not fill it."""
    fields, at = [], 0
    while at < len(extra):
        if at + 4 > len(extra):
            return None
        kind, length = struct.unpack_from("<2H", extra, at)
        if at + 4 + length > len(extra):
            return None
        fields.append((kind, extra[at + 4:at + 4 + length]))
        at += 4 + length
    return fields


def _layout_problem(fp, members: list[zipfile.ZipInfo]) -> Optional[str]:
    """Why the archive open as `fp`, whose central directory zipfile read as `members`, is
    not laid out the one way every reader reads alike, or None (the module's table says
    which field is held how)."""
    try:
        size = fp.seek(0, io.SEEK_END)
        found = _end_records(fp, size)
        if isinstance(found, str):
            return found
        entries, offset, length, ends_at = found
        if offset + length != ends_at:
            return f"its central directory is not where its end record says {SAME_READING}"
        if entries != len(members):
            return (f"its end record declares {entries} members and its central directory "
                    f"holds {len(members)} {SAME_READING}")
        central = _read_at(fp, offset, length)
        at = cursor = 0
        for member in members:
            problem, at, name = _entry_problem(central, at, member)
            if problem:
                return problem
            problem, cursor = _member_problem(fp, cursor, member, name)
            if problem:
                return problem
        if at != length:
            return f"its central directory holds more than its {entries} entries {SAME_READING}"
        if cursor != offset:
            return (f"it holds {offset - cursor} bytes between its last member and its central "
                    f"directory {SAME_READING}")
    except (_CutShort, struct.error):
        return "a record in it runs past its end"
    return None


def _end_records(fp, size: int) -> tuple[int, int, int, int] | str:
    """(entries, directory offset, directory size, where the directory must end) from the end
    record in the archive's last 22 bytes, and from the zip64 end record its locator names
    (which must be the 56 bytes before the locator); or why they cannot be read one way."""
    end = size - _END.size
    sig, disk, disk_cd, entries_here, entries, length, offset, comment = \
        _END.unpack(_read_at(fp, end, _END.size))
    if sig != END_SIG or comment:
        return ("its end record is not its last 22 bytes (an archive comment or data after it: "
                "a second reader could find another end record)")
    if disk or disk_cd or entries_here != entries:
        return "its end record spans disks"
    locator = _read_at(fp, end - _LOCATOR.size, _LOCATOR.size) if end >= _LOCATOR.size else b""
    if not locator.startswith(LOCATOR_SIG):
        return entries, offset, length, end
    _, disk64, record_at, disks = _LOCATOR.unpack(locator)
    expected = end - _LOCATOR.size - _END64.size
    if record_at != expected:
        return (f"its zip64 locator points to byte {record_at}, not to the zip64 end record "
                f"before it at byte {expected} {SAME_READING}")
    (sig64, record_length, _made_by, _needs, disk, disk_cd, entries_here, entries64, length64,
     offset64) = _END64.unpack(_read_at(fp, expected, _END64.size))
    if sig64 != END64_SIG or record_length != _END64.size - 12:
        return f"its zip64 locator points to no zip64 end record of its own {SAME_READING}"
    if disk64 or disks != 1 or disk or disk_cd or entries_here != entries64:
        return "its zip64 end record spans disks"
    if entries not in (entries64, MAX16) or length not in (length64, MAX32) or \
            offset not in (offset64, MAX32):
        return f"its end record and its zip64 end record disagree {SAME_READING}"
    return entries64, offset64, length64, expected


def _entry_problem(central: bytes, at: int, member: zipfile.ZipInfo
                   ) -> tuple[Optional[str], int, bytes]:
    """Why the central-directory entry at `at` reads otherwise than zipfile read it
    (`member`), or None; the next entry's offset, and the entry's name as bytes."""
    (sig, _made_by, _needs, flags, method, _time, _date, crc, packed, size, name_length,
     extra_length, comment_length, disk, _internal, external, offset) = \
        _CENTRAL.unpack_from(central, at)
    start = at + _CENTRAL.size
    name = central[start:start + name_length]
    fields = _extra_fields(central[start + name_length:start + name_length + extra_length])
    after = start + name_length + extra_length + comment_length
    wide = [data for kind, data in fields or () if kind == ZIP64_FIELD]
    values = [size, packed, offset]  # the zip64 field holds the 0xFFFFFFFF ones, in this order
    needed = [i for i, v in enumerate(values) if v == MAX32]
    shown = member.filename
    if sig != CENTRAL_SIG or after > len(central):
        return f"its central directory entry for {shown} is cut short", after, name
    if name != shown.encode("utf-8"):
        return (f"its member name {name!r} reads as {shown!r} in Python and as its bytes in "
                f"torch"), after, name
    if comment_length or disk or flags & ~READ_ALIKE_FLAGS or method not in (
            zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        return (f"its member {shown} has a comment, a disk, encryption or a method torch does "
                f"not read"), after, name
    if external & DOS_DIRECTORY or shown.endswith("/"):
        return f"its member {shown} is marked a folder, whose data torch never reads", after, name
    if fields is None or len(wide) > 1 or bool(wide) != bool(needed) or \
            wide and len(wide[0]) < 8 * len(needed):
        return (f"its member {shown} declares its zip64 sizes other than once where needed "
                f"{SAME_READING}"), after, name
    for n, i in enumerate(needed):
        values[i] = struct.unpack_from("<Q", wide[0], 8 * n)[0]
    if (values, crc, flags, method) != ([member.file_size, member.compress_size,
                                         member.header_offset], member.CRC, member.flag_bits,
                                        member.compress_type):
        return f"its central directory entry for {shown} reads two ways", after, name
    return None, after, name


def _member_problem(fp, cursor: int, member: zipfile.ZipInfo, name: bytes
                    ) -> tuple[Optional[str], int]:
    """Why the member `member` is not at `cursor` with a local header that matches its
    central-directory entry, or None; and where the next member must begin."""
    shown = member.filename
    if member.header_offset != cursor:
        if cursor == 0:
            return (f"it holds {member.header_offset} bytes before its first member (prepended "
                    f"data) {SAME_READING}"), cursor
        return (f"its member {shown} is at byte {member.header_offset}, not right after the "
                f"one before it at byte {cursor} {SAME_READING}"), cursor
    (sig, _needs, flags, method, _time, _date, crc, packed, size, name_length,
     extra_length) = _LOCAL.unpack(_read_at(fp, cursor, _LOCAL.size))
    local_name = _read_at(fp, cursor + _LOCAL.size, name_length)
    fields = _extra_fields(_read_at(fp, cursor + _LOCAL.size + name_length, extra_length))
    data_end = cursor + _LOCAL.size + name_length + extra_length + member.compress_size
    mismatch = f"the local header of {shown} does not match its central directory entry"
    if sig != LOCAL_SIG or local_name != name or fields is None or \
            (flags, method) != (member.flag_bits, member.compress_type):
        return mismatch, data_end
    wide = [data for kind, data in fields if kind == ZIP64_FIELD]
    declared = (crc, packed, size)
    if flags & HAS_DESCRIPTOR:  # the sizes follow the data (torch's writer): zeros here
        if declared not in ((0, 0, 0), (member.CRC, member.compress_size, member.file_size)):
            return mismatch, data_end
        form = _DESCRIPTOR64 if wide else _DESCRIPTOR
        after = form.unpack(_read_at(fp, data_end, form.size))
        if after != (DESCRIPTOR_SIG, member.CRC, member.compress_size, member.file_size):
            return (f"the data descriptor after {shown} does not match its central directory "
                    f"entry"), data_end
        return None, data_end + form.size
    if (packed, size) == (MAX32, MAX32) and len(wide) == 1 and len(wide[0]) >= 16:
        size, packed = struct.unpack_from("<2Q", wide[0])
    if (crc, packed, size) != (member.CRC, member.compress_size, member.file_size):
        return mismatch, data_end
    return None, data_end


def _read(archive: zipfile.ZipFile, name: str, path: Path) -> bytes:
    """One member's bytes, at most MAX_MEMBER_READ as the archive declares it."""
    try:
        declared = archive.getinfo(name).file_size
        if declared > MAX_MEMBER_READ:
            raise BundleError(f"cannot read {path}: {name} declares {declared} bytes, more "
                              f"than the {MAX_MEMBER_READ >> 20} MiB such a member holds")
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError, KeyError) as exc:
        raise BundleError(f"cannot read {path}: {name}: {first_line(exc)}") from None


def package_metadata(source: Source) -> dict[str, str]:
    """What an AOTInductor package says it was compiled for (AOTI_DEVICE_KEY, AOTI_CPU_ISA,
    ...) and carries (the description), read from the archive without loading it."""
    path = _where(source)
    with open_zip(source) as archive:
        names = [n for n in archive.namelist()
                 if f"/{AOTINDUCTOR_DIR}" in n and n.endswith("wrapper_metadata.json")]
        if not names:
            raise BundleError(f"{path} is not an AOTInductor package (no compiled model in it)")
        try:
            values = json.loads(_read(archive, names[0], path))
        except ValueError as exc:
            raise BundleError(f"{path}: unreadable package metadata: {first_line(exc)}") \
                from None
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise BundleError(f"{path}: its package metadata is not a map of strings")
    return values


def is_package(source: Source) -> bool:
    """An AOTInductor package (compiled code), rather than an ExportedProgram."""
    with open_zip(source) as archive:
        return any(f"/{AOTINDUCTOR_DIR}" in n for n in archive.namelist())


def parse_description(text: Optional[str]) -> Any:
    """The description JSON an archive carries, parsed, or None when it is absent or does
    not parse (the caller says what it lacks)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def carried_description(source: Source) -> Optional[str]:
    """The description JSON a model.pt2, model.aoti.pt2 or model.ts carries, or None: the
    extra file of a program or TorchScript archive, the metadata of a package."""
    path = _where(source)
    if path.suffix == ".pt2" and is_package(source):
        return package_metadata(source).get(METADATA_KEY)
    with open_zip(source) as archive:
        names = [n for n in archive.namelist() if n.endswith(f"/extra/{EXTRA_FILE}")]
        return _read(archive, names[0], path).decode("utf-8", "replace") if names else None


def _payload_problem(archive: zipfile.ZipFile, member: str, path: Path,
                     constants: bool) -> Optional[str]:
    """Why one payload config (`*_weights_config.json`, `*_constants_config.json`) would make
    the loader unpickle, or None."""
    try:
        values = json.loads(_read(archive, member, path))
        entries = values["config"]
        assert isinstance(entries, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{member} is not a payload config"
    for name, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            return f"{member} marks {name!r} as pickled"
        where = meta.get("path_name")
        if not isinstance(where, str) or constants and not where.startswith(TENSOR_PREFIX):
            return f"{member} stores {name!r} as {where!r}, an object, not a tensor"
    return None


def _sample_inputs_problem(data: bytes) -> Optional[str]:
    """The loader reads sample inputs with torch.load(weights_only=True) and, where that
    fails, again with weights_only=False: they must pass the safe load."""
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # the restricted unpickler's refusal, or a damaged file
        return f"its sample inputs are not plain tensors ({first_line(exc)[:120]})"
    return None


def program_problem(source: Source) -> Optional[str]:
    """Why torch.export.load could run code from the model.pt2 at `source` (a path, or its
    bytes as read once: then the bytes torch is given), or None: read from the archive's own
    members and payload configs, before torch reads it."""
    path = _where(source)
    with open_zip(source) as archive:
        names = archive.namelist()
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1 or any("/" not in n for n in names):
            return "its members are not under one folder (a legacy or foreign archive)"
        root = f"{roots.pop()}/"
        inner = [n[len(root):] for n in names]
        if "archive_format" not in inner or \
                _read(archive, root + "archive_format", path) != b"pt2":
            return "it is not a torch.export archive (no archive_format pt2)"
        if any(n.startswith(AOTINDUCTOR_DIR) for n in inner):
            return "it holds compiled AOTInductor code"
        foreign = [n for n in inner if not n.startswith(PROGRAM_PARTS)]
        if foreign:
            return f"it holds {foreign[0]}, which torch.export.save does not write"
        models = [n[len(MODELS_DIR):-len(".json")] for n in inner
                  if n.startswith(MODELS_DIR) and n.endswith(".json")]
        if not models:
            return "it holds no program"
        for model in models:
            for folder, constants in ((WEIGHTS_DIR, False), (CONSTANTS_DIR, True)):
                if f"{folder}{model}.pt" in inner:  # the legacy format: one pickle
                    return f"it holds {folder}{model}.pt, a pickle"
                config = f"{folder}{model}_{'constants' if constants else 'weights'}_config.json"
                if config not in inner:
                    return f"it lacks {config}"
                problem = _payload_problem(archive, root + config, path, constants)
                if problem:
                    return problem
            samples = f"data/sample_inputs/{model}.pt"
            if samples in inner:
                problem = _sample_inputs_problem(_read(archive, root + samples, path))
                if problem:
                    return problem
    return None


def check_program(source: Source) -> None:
    """BundleError in one line where `program_problem` finds the model.pt2 could run code."""
    path = _where(source)
    problem = program_problem(source)
    if problem:
        raise BundleError(f"{path} is refused before torch reads it: {problem} (what "
                          f"torch.export.load would run as code; our export never writes it)")
