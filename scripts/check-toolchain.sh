#!/usr/bin/env bash
# Stops with one line unless cargo is installed and rustc is at least the
# workspace's rust-version (Cargo.toml, [workspace.package]): what is
# needed, what is installed, and how to update it. Run first by
# scripts/test.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "$*" >&2; exit 1; }

need=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^rust-version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
[ -n "$need" ] || fail "Cargo.toml has no rust-version in [workspace.package]"

command -v cargo >/dev/null ||
  fail "cargo is not installed: the workspace needs Rust $need or newer (install it with rustup, https://rustup.rs)"
command -v rustc >/dev/null ||
  fail "rustc is not installed: the workspace needs Rust $need or newer (install it with rustup, https://rustup.rs)"
said=$(rustc --version 2>&1) ||
  fail "rustc does not run ($(head -n1 <<<"$said")): the workspace needs Rust $need or newer (\`rustup default stable\`)"

have=$(sed -n 's/^rustc \([0-9][0-9.]*\).*/\1/p' <<<"$said")
if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  fail "the workspace needs Rust $need or newer (rust-version in Cargo.toml) but ${said:-an unknown rustc} is installed: update it with \`rustup update stable\`"
fi
