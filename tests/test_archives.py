"""An archive is read one way or not at all. Python's zipfile finds the central directory just
before the end record and the zip64 end record just before its locator; torch's reader
(miniz) follows the recorded offsets. Each attack here is built as its author would build it,
from the program our export wrote: Python reads the clean members, torch would read a payload
config that marks cls_token pickled and a pickle that creates a marker file when it runs. Each
is refused in one line before torch reads it, and a control hands the same bytes to torch's
own loader to show that the payload is real."""
import contextlib
import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_line, rewrite_hash, run

from vit_export import archives, pt2
from vit_export import bundle as B
from vit_export.errors import BundleError
from vit_export.runtime.pytorch import load_torchscript
from vit_export.verified import Loaded, read_once

_END = struct.Struct("<4s4H2IH")  # end record: disks, entries, directory size and offset, comment
_END64 = struct.Struct("<4sQ2H2I4Q")  # zip64 end record
_LOCATOR = struct.Struct("<4sIQI")  # zip64 locator: its disk, the zip64 record's offset, disks


class _Touch:
    """Unpickled, it creates `marker`: what a hostile pickle does, harmlessly."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _directory(data: bytes) -> tuple[int, int, int]:
    """(offset, size, entries) of the central directory the end record names."""
    _, _, _, _, entries, size, offset, _ = _END.unpack(data[-_END.size:])
    return offset, size, entries


def _moved(central: bytes, by: int) -> bytes:
    """A central directory whose entries name local headers `by` bytes further on."""
    out, at = bytearray(central), 0
    while at < len(out):
        name, extra, comment = struct.unpack_from("<3H", out, at + 28)
        struct.pack_into("<I", out, at + 42, struct.unpack_from("<I", out, at + 42)[0] + by)
        at += 46 + name + extra + comment
    return bytes(out)


def _end(entries: int, size: int, offset: int, comment: bytes = b"") -> bytes:
    return _END.pack(b"PK\x05\x06", 0, 0, entries, entries, size, offset, len(comment)) + comment


def _end64(entries: int, size: int, offset: int) -> bytes:
    return _END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, size, offset)


def _poisoned(clean: bytes, marker: Path) -> bytes:
    """The members of `clean`, written by Python's zipfile, with cls_token's payload config
    marking it pickled and its file a pickle that creates `marker`."""
    with zipfile.ZipFile(io.BytesIO(clean)) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    config = next(n for n in members if n.endswith("/data/weights/model_weights_config.json"))
    values = json.loads(members[config])
    values["config"]["cls_token"]["use_pickle"] = True
    members[config] = json.dumps(values).encode()
    payload = io.BytesIO()
    torch.save(_Touch(marker), payload)
    members[config.replace("model_weights_config.json",
                           values["config"]["cls_token"]["path_name"])] = payload.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def _second_directory_behind_a_gap(clean: bytes, marker: Path) -> bytes:
    """The clean members and directory as torch wrote them, a poisoned copy's members and
    directory between them, and an end record naming the poisoned directory: zipfile reads
    the one before the end record (a gap of one directory, its length, taken for prepended
    data, which the same length of zeros at the front makes true), torch the one named."""
    offset, size, entries = _directory(clean)
    evil = _poisoned(clean, marker)
    evil_offset, evil_size, evil_entries = _directory(evil)
    assert (evil_size, evil_entries) == (size, entries)  # the same names: the same length
    base = size + offset  # where the poisoned members begin
    return (bytes(size) + clean[:offset] + evil[:evil_offset]
            + _moved(evil[evil_offset:evil_offset + evil_size], base)
            + clean[offset:offset + size] + _end(entries, size, base + evil_offset))


def _locator_pointing_elsewhere(clean: bytes, marker: Path) -> bytes:
    """The clean members, a poisoned copy's members and directory with a zip64 end record of
    their own, then the clean directory, its zip64 end record, and a locator naming the
    poisoned one: zipfile reads the record before the locator, torch the record it names."""
    offset, size, entries = _directory(clean)
    evil = _poisoned(clean, marker)
    evil_offset, evil_size, evil_entries = _directory(evil)
    evil_directory = offset + evil_offset
    evil_record = evil_directory + evil_size
    directory = evil_record + _END64.size
    return (clean[:offset] + evil[:evil_offset]
            + _moved(evil[evil_offset:evil_offset + evil_size], offset)
            + _end64(evil_entries, evil_size, evil_directory)
            + clean[offset:offset + size] + _end64(entries, size, directory)
            + _LOCATOR.pack(b"PK\x06\x07", 0, evil_record, 1) + _end(entries, size, directory))


def _with_comment(evil: bytes) -> bytes:
    offset, size, entries = _directory(evil)
    return evil[:-_END.size] + _end(entries, size, offset, b"read by both")


def _with_trailing_data(evil: bytes) -> bytes:
    return evil + bytes(64)


def _with_prepended_data(evil: bytes) -> bytes:
    """64 bytes in front, every offset moved past them: both readers skip them, and a reader
    that scans from the front meets them first."""
    offset, size, entries = _directory(evil)
    return (bytes(64) + evil[:offset] + _moved(evil[offset:offset + size], 64)
            + _end(entries, size, offset + 64))


@pytest.fixture
def sample(tmp_path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((3, 32, 32), np.float32))
    return path


def _bundle_with(program_bundle: Path, folder: Path, data: bytes) -> Path:
    """A copy of the program bundle whose model.pt2 is `data`, config.json re-hashed as the
    archive's author would."""
    bundle = shutil.copytree(program_bundle, folder / "b")
    (bundle / B.PT2_FILE).write_bytes(data)
    rewrite_hash(bundle, B.PT2_FILE)
    return bundle


def _refused_everywhere(bundle: Path, sample: Path, marker: Path, reason: str) -> None:
    """Every way in that runs model.pt2 refuses it in one line, before torch reads it."""
    pt2_file = bundle / B.PT2_FILE
    for args in (("infer", pt2_file, sample), ("infer", bundle, sample, "--runtime", "pt2"),
                 ("validate", bundle, "--trust-code")):
        code, stdout, stderr = run(*args)
        assert code == 1, (args, stdout, stderr)
        assert one_line(stderr) == (f"Error: {pt2_file} is refused before torch reads it: "
                                    f"{reason}"), args
        assert not marker.exists(), args


def _torch_runs_it(data: bytes, marker: Path) -> None:
    """The control: torch's own loader, given the same bytes, runs the payload."""
    # cls_token, unpickled, is no Parameter: the load fails after the payload ran
    with contextlib.suppress(Exception), pt2._quiet_loaders():
        torch.export.load(io.BytesIO(data))
    assert marker.exists()


def test_a_second_central_directory_behind_a_gap_is_refused(program_bundle, tmp_path, sample):
    marker = tmp_path / "ran"
    data = _second_directory_behind_a_gap((program_bundle / B.PT2_FILE).read_bytes(), marker)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # what Python reads: the clean config
        assert b'"use_pickle": true' not in archive.read(
            "archive/data/weights/model_weights_config.json")
    bundle = _bundle_with(program_bundle, tmp_path, data)
    _refused_everywhere(bundle, sample, marker, "its central directory is not where its end "
                        "record says (a second reader could read another one)")
    _torch_runs_it(data, marker)


def test_a_zip64_locator_that_points_elsewhere_is_refused(program_bundle, tmp_path, sample):
    marker = tmp_path / "ran"
    data = _locator_pointing_elsewhere((program_bundle / B.PT2_FILE).read_bytes(), marker)
    offset, size, _ = _directory(data)
    locator = _LOCATOR.unpack(data[-_END.size - _LOCATOR.size:-_END.size])
    bundle = _bundle_with(program_bundle, tmp_path, data)
    _refused_everywhere(bundle, sample, marker,
                        f"its zip64 locator points to byte {locator[2]}, not to the zip64 end "
                        f"record before it at byte {offset + size} (a second reader could read "
                        f"another one)")
    _torch_runs_it(data, marker)


ANOTHER_END = ("its end record is not its last 22 bytes (an archive comment or data after it: a "
               "second reader could find another end record)")
SURROUNDINGS = {  # what surrounds a poisoned archive -> why it is refused
    "an archive comment": (_with_comment, ANOTHER_END),
    "data after the end record": (_with_trailing_data, ANOTHER_END),
    "data before the first member": (_with_prepended_data, ("it holds 64 bytes before its first "
                                     "member (prepended data) (a second reader could read "
                                     "another one)")),
}


@pytest.mark.parametrize("kind", list(SURROUNDINGS))
def test_an_archive_with_bytes_around_its_records_is_refused_before_its_members_are_read(
        program_bundle, tmp_path, sample, kind):
    """The layout is refused before any member is read: the poisoned config inside is never
    reached (its own refusal would say "marks 'cls_token' as pickled")."""
    marker = tmp_path / "ran"
    surround, reason = SURROUNDINGS[kind]
    data = surround(_poisoned((program_bundle / B.PT2_FILE).read_bytes(), marker))
    bundle = _bundle_with(program_bundle, tmp_path, data)
    _refused_everywhere(bundle, sample, marker, reason)
    _torch_runs_it(data, marker)


def test_our_exports_archives_pass_and_load_as_torchs_own_loaders_load_them(program_bundle):
    """torch.export.save's and torch.jit.save's archives (data descriptors, zip64 end
    records, padded extra fields) have one reading: ours loads what torch's loader loads."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    for name in (B.PT2_FILE, B.TS_FILE):
        archives.open_zip(read_once(program_bundle / name)).close()  # not refused
    ours = pt2.read_program(program_bundle / B.PT2_FILE).module()(x)
    theirs = torch.export.load(str(program_bundle / B.PT2_FILE)).module()(x)
    assert torch.equal(ours, theirs)
    runner = load_torchscript(program_bundle / B.TS_FILE)
    assert torch.equal(runner(x), torch.jit.load(str(program_bundle / B.TS_FILE))(x))


def _small_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("archive/first", b"1" * 100)
        archive.writestr("archive/second", b"2" * 100)
    return out.getvalue()


def _entry(data: bytes, index: int) -> int:
    """Where the `index`th central-directory entry of `data` begins."""
    at = _directory(data)[0]
    for _ in range(index):
        name, extra, comment = struct.unpack_from("<3H", data, at + 28)
        at += 46 + name + extra + comment
    return at


def _marked_a_folder(data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into("<I", out, _entry(data, 1) + 38, 0x10)  # the DOS folder attribute
    return bytes(out)


def _named_in_cp437(data: bytes) -> bytes:
    """"second" as "s\x82cond" in both headers, the UTF-8 flag clear: zipfile reads "séc..."
    (cp437), torch looks the name up as the bytes it is given."""
    return data.replace(b"archive/second", b"archive/s\x82cond")


def _local_header_of_another_name(data: bytes) -> bytes:
    return data.replace(b"archive/second", b"archive/SECOND", 1)  # the local header only


def _bytes_before_the_directory(data: bytes) -> bytes:
    offset, size, entries = _directory(data)
    return data[:offset] + bytes(16) + data[offset:offset + size] + _end(entries, size,
                                                                         offset + 16)


def _zip64_field_not_needed(_: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        info = zipfile.ZipInfo("archive/first")
        info.extra = struct.pack("<2HQ", 1, 8, 100)  # a size of 100 in a zip64 field
        archive.writestr(info, b"1" * 100)
    return out.getvalue()


DEFECTS = {
    "a member marked a folder": (_marked_a_folder, ("its member archive/second is marked a "
                                 "folder, whose data torch never reads")),
    "a name zipfile reads as cp437": (_named_in_cp437, ("its member name b'archive/s\\x82cond' "
                                      "reads as 'archive/s\u00e9cond' in Python and as its "
                                      "bytes in torch")),
    "a local header of another name": (_local_header_of_another_name, ("the local header of "
                                       "archive/second does not match its central directory "
                                       "entry")),
    "bytes before the directory": (_bytes_before_the_directory, ("it holds 16 bytes between its "
                                   "last member and its central directory (a second reader "
                                   "could read another one)")),
    "a zip64 field not needed": (_zip64_field_not_needed, ("its member archive/first declares "
                                 "its zip64 sizes other than once where needed (a second "
                                 "reader could read another one)")),
}


@pytest.mark.parametrize("kind", list(DEFECTS))
def test_a_field_the_two_readers_could_read_apart_is_refused(kind):
    change, reason = DEFECTS[kind]
    data = change(_small_zip())
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # zipfile itself reads it
        assert len(archive.namelist()) in (1, 2)
    with pytest.raises(BundleError) as refused:
        archives.open_zip(Loaded(Path("x.pt2"), data, "")).close()
    assert str(refused.value) == f"x.pt2 is refused before torch reads it: {reason}"


def test_a_data_descriptor_that_disagrees_with_its_entry_is_refused(program_bundle):
    """torch's writer puts each member's CRC and sizes after its data, and zeros in its local
    header: a reader that streams the archive takes them from there."""
    data = bytearray((program_bundle / B.PT2_FILE).read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        first = archive.infolist()[0]
    assert first.flag_bits & 0x08  # torch writes a data descriptor
    descriptor = data.index(b"PK\x07\x08", first.header_offset)
    struct.pack_into("<I", data, descriptor + 8, first.compress_size + 1)
    with pytest.raises(BundleError) as refused:
        archives.open_zip(Loaded(Path("model.pt2"), bytes(data), "")).close()
    assert str(refused.value) == (f"model.pt2 is refused before torch reads it: the data "
                                  f"descriptor after {first.filename} does not match its "
                                  f"central directory entry")
