#!/usr/bin/env bash
# Regenerate the *_pb2.py / *_pb2.pyi modules from the .proto files here.
#
# Not run at install time; the generated files are committed. Re-run after
# editing any .proto file. Requires grpcio-tools 1.71.0 (bundles protoc for
# protobuf 5.29, whose generated code runs on protobuf >= 5.29, incl. 6.x/7.x):
#
#   python3 -m venv /tmp/gt-venv && /tmp/gt-venv/bin/pip install grpcio-tools==1.71.0
#   PYTHON=/tmp/gt-venv/bin/python src/hotspan/formats/proto/regenerate.sh
#
# The .proto files import each other as "hotspan/formats/proto/<name>.proto"
# and protoc runs with -I <repo>/src, so generated modules import each other
# as hotspan.formats.proto.<name>_pb2.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../../.." && pwd)"

cd "$src"
"$PYTHON" -m grpc_tools.protoc \
  -I "$src" \
  --python_out="$src" \
  --pyi_out="$src" \
  hotspan/formats/proto/profile.proto \
  hotspan/formats/proto/types.proto \
  hotspan/formats/proto/push.proto \
  hotspan/formats/proto/querier.proto \
  hotspan/formats/proto/tempo_common.proto \
  hotspan/formats/proto/tempo.proto \
  hotspan/formats/proto/jfr_labels.proto
echo "regenerated protobuf modules in $here"
