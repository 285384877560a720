"""taskhub's settings for bench/fanout.py --redis-socket-timeout S: the Redis connections of the channel layer
get a socket timeout of S seconds instead of redis-py 8's default of 5 s, which equals channels_redis's
BZPOPMIN timeout (5 s) and so makes an idle consumer's receive fail with "Timeout reading from 127.0.0.1:6379"
(the consumer dies and its WebSocket closes). Everything else is taskhub.settings unchanged.
"""

import os

from taskhub.settings import *  # noqa: F403

if os.environ.get("BENCH_REDIS_SOCKET_TIMEOUT") and os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [  # noqa: F405
        {"address": os.environ["REDIS_URL"], "socket_timeout": float(os.environ["BENCH_REDIS_SOCKET_TIMEOUT"])}
    ]

# BENCH_CHANNEL_LAYER=pubsub: channels_redis's pub/sub layer (one PUBLISH per group, each process delivers to its
# own members) instead of the core layer (one message per member channel, popped one by one by the receiver).
if os.environ.get("BENCH_CHANNEL_LAYER") == "pubsub" and os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS["default"]["BACKEND"] = "channels_redis.pubsub.RedisPubSubChannelLayer"  # noqa: F405
