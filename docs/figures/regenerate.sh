#!/bin/sh
# Regenerates docs/OUTPUTS.md's example figures (one of each kind: boxplot, CDF,
# time series, percentiles, stages) from a real run on rtprobe's own veth testbed: kernel
# forwarding (XDP off, red) against the XDP router in native mode (blue).
#
# Needs root for the probe runs (namespaces, XDP) and a release build:
#   cargo build --release && sudo docs/figures/regenerate.sh
# Only rtprobe itself is used: no cargo xtask, Python or gnuplot.
#
# The CSVs stay next to the figures (git-ignored) so the figures can be
# redrawn without re-running the probe:
#   target/release/rtprobe plot docs/figures/xdp-off.csv docs/figures/xdp-native.csv \
#     --out-dir docs/figures --prefix example --metric one-way
set -eu

here=$(cd "$(dirname "$0")" && pwd)
rtprobe=${RTPROBE:-$here/../../target/release/rtprobe}
count=${COUNT:-5000}

"$rtprobe" --xdp-mode off --size 64 --interval 1ms --count "$count" \
    --label "XDP off" --out "$here/xdp-off.csv" --quiet
"$rtprobe" --xdp-mode native --size 64 --interval 1ms --count "$count" \
    --label "XDP native" --out "$here/xdp-native.csv" --quiet

"$rtprobe" plot "$here/xdp-off.csv" "$here/xdp-native.csv" \
    --out-dir "$here" --prefix example --metric one-way
# -> example-one-way-box.svg, example-one-way-cdf.svg, example-one-way-time.svg,
#    example-one-way-percentiles.svg, example-stages.svg

# docs/STUDIES.md, study 3 (the XDP thesis's axes): THESIS=1 reruns the
# sweep of configs/xdp-thesis.toml (about 5 minutes); otherwise the figure
# is redrawn from the stored report, which needs no root.
if [ "${THESIS:-0}" = 1 ]; then
    "$rtprobe" bench-forward --config "$here/../../configs/xdp-thesis.toml" \
        --json "$here/xdp-thesis.json"
fi
"$rtprobe" plot "$here/xdp-thesis.json" --out-dir "$here" --format svg,png \
    --figure-size 1500x560
# -> xdp-thesis-forwarding.svg, xdp-thesis-forwarding.png
