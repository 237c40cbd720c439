#!/usr/bin/env bash
# Puts NVIDIA's perf_analyzer (shipped in the tritonclient 2.51.0 wheel) at .tools/bin/perf_analyzer,
# with the two libraries it needs taken from the nvidia-pytriton wheel (libb64, libcudart 12).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .tools/bin/perf_analyzer ] && exit 0
mkdir -p .tools/bin .tools/lib .tools/download
.venv/bin/python -m pip download --quiet --no-deps tritonclient==2.51.0 -d .tools/download
unzip -o -q -j .tools/download/tritonclient-2.51.0-*.whl 'tritonclient-2.51.0.data/data/bin/perf_analyzer' -d .tools/bin
chmod +x .tools/bin/perf_analyzer
libs=$(.venv/bin/python -c "import importlib.util, pathlib; s = importlib.util.find_spec('pytriton'); print(pathlib.Path(list(s.submodule_search_locations)[0]).parent / 'nvidia_pytriton.libs')")
ln -sf "$(ls "$libs"/libb64-*.so.0d)" .tools/lib/libb64.so.0d
ln -sf "$(ls "$libs"/libcudart-*.so.12*)" .tools/lib/libcudart.so.12
cat > .tools/perf_analyzer <<WRAP
#!/usr/bin/env bash
LD_LIBRARY_PATH="$PWD/.tools/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$PWD/.tools/bin/perf_analyzer" "\$@"
WRAP
chmod +x .tools/perf_analyzer
echo "perf_analyzer: .tools/perf_analyzer"
