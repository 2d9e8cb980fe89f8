# Source this on the GPU machine (device tool) from the repository root:  source bench/gpu_setup.sh
#
# That machine has torch, Triton and pytest but none of the service's dependencies and no network:
# the wheels travel in .whl/ (docs/gpu.md says which), and optionally a Redis server in .whl/redis/
# (redis-server + the two libraries it needs that the machine lacks) for the `redis` contender.
# Installs the wheels into /tmp/site, makes `cachesvc_client` importable from the checkout, and
# starts Redis on 127.0.0.1:6379 when it was carried. Sets BENCH_REDIS=1 when Redis answers.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
ln -sfn "$PWD/migrations" cachesvc/migrations
mkdir -p /tmp/pp && ln -sfn "$PWD/client" /tmp/pp/cachesvc_client
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1 CACHESVC_TEST_PG=skip
BENCH_REDIS=0
if [[ -x .whl/redis/redis-server ]]; then
    LD_LIBRARY_PATH=$PWD/.whl/redis .whl/redis/redis-server --port 6379 --bind 127.0.0.1 --save '' \
        --appendonly no --daemonize yes >/dev/null 2>&1 || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        python3 -c 'import redis; redis.Redis(port=6379).ping()' 2>/dev/null && { BENCH_REDIS=1; break; }
        sleep 0.3
    done
fi
export BENCH_REDIS
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
echo "redis: $BENCH_REDIS"
