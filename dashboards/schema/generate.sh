#!/usr/bin/env bash
# Regenerates dashboard.schema.json from Grafana's own dashboard types. Run once
# by hand when moving to a newer @grafana/schema; CI only validates against the
# committed file (no node needed). ts-json-schema-generator > 2.4.0 needs node 22.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm install --no-audit --no-fund @grafana/schema@13.2.3 ts-json-schema-generator@2.4.0 >/dev/null
npx ts-json-schema-generator --path node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts \
    --type Dashboard --no-type-check --additional-properties -o "$here/dashboard.schema.json"
