#!/usr/bin/python3
"""Reads TensorBoard event files on its own, to test the files dplua writes.

    /usr/bin/python3 tests/tensorboard/read_events.py LOGDIR_OR_FILE...

Compiles the .proto files beside it (the published schemas of Event,
Summary, TensorProto and the hparams and text plugins) with protoc into a
temporary folder, then reads every events.out.tfevents.* file: each TFRecord
(uint64 length, masked CRC-32C of the length, the data, masked CRC-32C of
the data), checking both CRCs, that the file ends at a record's end and
that the first event is file_version "brain.Event:2"; decodes each Event
and the plugin data it carries. Prints JSON on stdout:

    [{"run": "sub/dir", "file": "events.out...", "events": [event, ...]}, ...]

each event as protobuf's JSON mapping with the field names of the .proto
(int64 as strings, bytes as base64), its step as a number, a simple_value
as the exact value of its float (not its shortest decimal), and beside a
summary value of a plugin: "hparams" (the decoded HParamsPluginData) or
"text" (the tensor's strings). Any damage is an error on stderr and exit
status 1. Needs Debian's python3-protobuf, protobuf-compiler and
libprotobuf-dev (for google/protobuf/struct.proto).
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    sys.stderr.write("read_events: %s\n" % msg)
    sys.exit(1)


# CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, bit by bit into a
# table of 256 entries.
def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def compile_protos(out):
    protos = sorted(glob.glob(os.path.join(HERE, "*.proto")))
    cmd = ["protoc", "-I" + HERE, "-I/usr/include", "--python_out=" + out] + protos
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        fail("protoc is not installed (Debian: protobuf-compiler)")
    if r.returncode != 0:
        fail("protoc failed: " + r.stderr.strip())
    sys.path.insert(0, out)


def records(path):
    """Yields the data of each TFRecord of the file, checking its CRCs."""
    with open(path, "rb") as f:
        blob = f.read()
    pos, n = 0, 0
    while pos < len(blob):
        if len(blob) - pos < 12:
            fail("%s: %d bytes at offset %d are not a record header" % (path, len(blob) - pos, pos))
        header = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if masked(crc32c(header)) != len_crc:
            fail("%s: record %d: the length's CRC is %08x, expected %08x" % (path, n, len_crc, masked(crc32c(header))))
        end = pos + 12 + length + 4
        if end > len(blob):
            fail("%s: record %d: %d bytes of data run past the end of the file" % (path, n, length))
        data = blob[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", blob[end - 4:end])
        if masked(crc32c(data)) != data_crc:
            fail("%s: record %d: the data's CRC is %08x, expected %08x" % (path, n, data_crc, masked(crc32c(data))))
        yield data
        pos, n = end, n + 1


def decode_file(path, pb):
    from google.protobuf import json_format

    def to_dict(m):
        return json_format.MessageToDict(m, preserving_proto_field_name=True)

    events = []
    for i, data in enumerate(records(path)):
        ev = pb["event"].Event()
        ev.ParseFromString(data)
        if ev.SerializeToString() != data:
            fail("%s: record %d does not re-encode to the same bytes" % (path, i))
        if i == 0 and ev.WhichOneof("what") != "file_version":
            fail("%s: the first event holds %s, not file_version" % (path, ev.WhichOneof("what")))
        if i == 0 and ev.file_version != "brain.Event:2":
            fail("%s: file_version is %r" % (path, ev.file_version))
        d = to_dict(ev)
        d["step"] = ev.step
        for v, dv in zip(ev.summary.value, d.get("summary", {}).get("value", [])):
            if v.WhichOneof("value") == "simple_value":
                dv["simple_value"] = v.simple_value  # the float's exact value, not its shortest form
            plugin = v.metadata.plugin_data.plugin_name
            content = v.metadata.plugin_data.content
            if plugin == "hparams":
                pd = pb["hparams_plugin_data"].HParamsPluginData()
                pd.ParseFromString(content)
                dv["hparams"] = to_dict(pd)
            elif plugin == "text":
                pb["text_plugin_data"].TextPluginData().ParseFromString(content)
                dv["text"] = [s.decode("utf-8") for s in v.tensor.string_val]
        events.append(d)
    if not events:
        fail("%s: no records" % path)
    return events


def main(args):
    if not args:
        fail("usage: read_events.py LOGDIR_OR_FILE...")
    if crc32c(b"123456789") != 0xE3069283:
        fail("the CRC-32C check value is wrong")
    tmp = tempfile.mkdtemp(prefix="read_events.")
    try:
        compile_protos(tmp)
        try:
            import google.protobuf  # noqa: F401
        except ImportError:
            fail("python3-protobuf is not installed")
        import importlib
        pb = {n: importlib.import_module(n + "_pb2")
              for n in ("event", "hparams_plugin_data", "text_plugin_data")}
        files = []
        for a in args:
            if os.path.isdir(a):
                for root, _, names in sorted(os.walk(a)):
                    for name in sorted(names):
                        if name.startswith("events.out.tfevents."):
                            files.append((os.path.relpath(root, a), os.path.join(root, name)))
            elif os.path.isfile(a):
                files.append((".", a))
            else:
                fail("%s: no such file or folder" % a)
        out = [{"run": run, "file": os.path.basename(p), "events": decode_file(p, pb)} for run, p in files]
        json.dump(out, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
