"""The ``.proto`` printer (cdc_relay/sink/registry/proto_text.py): a file compiled by protoc,
printed, compiled again, gives the same descriptor; a golden text for the common case."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from cdc_relay.sink.registry.proto_text import proto_text

protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (a test dependency)")

COMMON = """syntax = "proto3";
package shop.common;
option java_package = "com.shop.common";
message Money { string currency = 1; sint64 units = 2; }
enum Status { option allow_alias = true; STATUS_UNKNOWN = 0; NEW = 1; FRESH = 1; PAID = 2 [deprecated = true];
  reserved 5, 8 to 10, 20 to max; reserved "GONE"; }
"""
PROTO3 = """syntax = "proto3";
package shop;
import "common.proto";
import "google/protobuf/timestamp.proto";
option go_package = "example.com/shop";
option optimize_for = SPEED;
message Order {
  int64 id = 1;
  optional string note = 2;
  repeated shop.common.Money lines = 3;
  map<string, int32> counts = 4;
  map<int64, Line> by_number = 5;
  oneof payment { string card = 6; bytes token = 7 [json_name = "tok"]; }
  google.protobuf.Timestamp created_at = 8;
  shop.common.Status status = 9;
  repeated int32 packed_off = 10 [packed = false];
  double ratio = 11 [deprecated = true];
  message Line { string sku = 1; Kind kind = 2; enum Kind { KIND_UNKNOWN = 0; GOOD = 1; } }
  reserved 12, 15 to 17; reserved "old";
}
message Empty {}
service Orders { rpc Get (Order) returns (stream Order);
  rpc Put (stream Order) returns (Empty) { option deprecated = true; } }
"""
PROTO2 = """syntax = "proto2";
package legacy;
message Item {
  required int32 id = 1;
  optional string name = 2 [default = "a \\"b\\"\\n"];
  optional bytes blob = 3 [default = "\\001\\377"];
  optional float weight = 4 [default = -inf];
  optional Colour colour = 5 [default = RED];
  repeated int64 tags = 6 [packed = true];
  optional bool ok = 7 [default = true];
  extensions 100 to 199, 1000 to max;
  enum Colour { RED = 1; BLUE = 2; }
}
extend Item { optional int32 extra = 100; }
"""


def compiled(tmp_path: Path, sources: dict[str, str], main: str) -> list[descriptor_pb2.FileDescriptorProto]:
    """protoc's FileDescriptorSet (with imports, as ``--include_imports`` writes it)."""
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "out.desc"
    include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(["protoc", f"-I{tmp_path}", f"-I{include}", "--include_imports",
                        f"--descriptor_set_out={out}", str(tmp_path / main)])
    assert code == 0, sources
    return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)


@pytest.mark.parametrize(("sources", "main"), [
    ({"common.proto": COMMON, "order.proto": PROTO3}, "order.proto"),
    ({"legacy.proto": PROTO2}, "legacy.proto")])
def test_a_printed_file_compiles_back_to_the_same_descriptor(
        tmp_path: Path, sources: dict[str, str], main: str) -> None:
    files = compiled(tmp_path / "a", sources, main) if (tmp_path / "a").mkdir() is None else []
    printed = {file.name: proto_text(file) for file in files if not file.name.startswith("google/")}
    (tmp_path / "b").mkdir()
    again = {file.name: file for file in compiled(tmp_path / "b", printed, main)}
    for file in files:
        assert again[file.name] == file, printed.get(file.name, file.name)


def test_the_common_case_prints_as_written_by_hand(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (order,) = [f for f in compiled(tmp_path / "a", {"common.proto": COMMON, "order.proto": PROTO3},
                                    "order.proto") if f.name == "order.proto"]
    text = proto_text(order)
    assert text.startswith('syntax = "proto3";\npackage shop;\n\nimport "common.proto";\n'
                           'import "google/protobuf/timestamp.proto";\n\n'
                           'option optimize_for = SPEED;\noption go_package = "example.com/shop";\n')
    for line in ("  optional string note = 2;", "  repeated shop.common.Money lines = 3;",
                 "  map<string, int32> counts = 4;", "  map<int64, shop.Order.Line> by_number = 5;",
                 "  oneof payment {", '    bytes token = 7 [json_name = "tok"];',
                 "  google.protobuf.Timestamp created_at = 8;", "  reserved 12, 15 to 17;",
                 '  reserved "old";', "  rpc Get (shop.Order) returns (stream shop.Order);"):
        assert line + "\n" in text, text
    assert "LineEntry" not in text and "CountsEntry" not in text  # map entries are maps


def test_editions_and_groups_are_refused_with_the_reason() -> None:
    editions = descriptor_pb2.FileDescriptorProto(name="e.proto", syntax="editions")
    with pytest.raises(ValueError, match="editions files cannot be printed"):
        proto_text(editions)
    grouped = descriptor_pb2.FileDescriptorProto(name="g.proto", syntax="proto2")
    message = grouped.message_type.add(name="M")
    message.field.add(name="g", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_GROUP,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, type_name=".M.G")
    with pytest.raises(ValueError, match="proto2 groups"):
        proto_text(grouped)


@pytest.mark.parametrize("indexes", [[0], [1], [0, 2], [3, 0, 1]])
def test_the_frame_is_the_one_confluent_kafkas_serializer_writes(indexes: list[int]) -> None:
    import io

    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    from cdc_relay.sink.registry.proto_wire import frame

    expected = io.BytesIO()
    ProtobufSerializer._encode_varints(expected, indexes)
    assert frame(258, indexes, b"body") == b"\0\0\0\x01\x02" + expected.getvalue() + b"body"


def test_message_indexes_are_the_ones_confluent_kafka_computes(tmp_path: Path) -> None:
    from confluent_kafka.schema_registry.common.protobuf import _create_index_array
    from google.protobuf import descriptor_pool

    from cdc_relay.sink.registry.proto_wire import message_indexes

    pool = descriptor_pool.DescriptorPool()
    (tmp_path / "a").mkdir()
    for file in compiled(tmp_path / "a", {"common.proto": COMMON, "order.proto": PROTO3}, "order.proto"):
        pool.Add(file)
    for name in ("shop.Order", "shop.Empty", "shop.Order.Line", "shop.common.Money"):
        descriptor = pool.FindMessageTypeByName(name)
        assert message_indexes(descriptor) == _create_index_array(descriptor), name
    assert message_indexes(pool.FindMessageTypeByName("shop.Order.Line")) == [0, 2]


def test_an_editions_desc_is_one_start_up_line_naming_the_file(tmp_path: Path) -> None:
    from cdc_relay.config import RegistryConfig
    from cdc_relay.errors import ConfigError
    from cdc_relay.sink.registry.encoder import Encoder, new_client

    file = descriptor_pb2.FileDescriptorProto(name="e.proto", package="e", syntax="editions",
                                              edition=descriptor_pb2.EDITION_2023)
    file.message_type.add(name="M").field.add(
        name="id", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    path = tmp_path / "M.desc"
    path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString())
    config = RegistryConfig(url="http://registry.invalid", message_format="protobuf",
                            value_schemas=(("M", str(path)),))
    with pytest.raises(ConfigError, match=rf"--value-schema M={path}: e.proto: editions files"):
        Encoder(config, new_client(config))  # the client is not called: nothing registered yet
