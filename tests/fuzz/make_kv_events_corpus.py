#!/usr/bin/env python3
"""Writes the seeds of fuzz_kv_events (corpus/fuzz_kv_events/): EventBatch payloads shaped as vLLM publishes
them, in both encodings, written by Python's msgpack (the encoding vLLM's msgspec shares). The seeds are
committed; run this again only to change them (Debian: apt-get install python3-msgpack).

vLLM's shapes (vllm/distributed/kv_events.py): the batch is [ts, events, data_parallel_rank] (a trailing
None left out) or, since vLLM 0.26, a map with those keys; events are tagged arrays
["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
extra_keys, group_idx], ["BlockRemoved", block_hashes, medium, group_idx], ["AllBlocksCleared"], or maps
with a "type" key and the same names. Block hashes are bytes (sha256) or integers.
"""
import hashlib
import pathlib

import msgpack

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "fuzz_kv_events"
BLOCK = 16


def sha(i):
    return hashlib.sha256(str(i).encode()).digest()


def tokens(blocks, first=1000):
    return list(range(first, first + blocks * BLOCK))


FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
          "extra_keys", "group_idx"]


def stored(hashes, parent, toks, lora_id=None, medium="GPU", lora_name=None, extra_keys=None, group_idx=None,
           trailing=True):
    values = [hashes, parent, toks, BLOCK, lora_id, medium, lora_name, extra_keys, group_idx]
    if trailing:  # msgspec's omit_defaults leaves trailing defaults out
        while values and values[-1] is None:
            values.pop()
    return ["BlockStored", *values]


def as_map(event):
    kind, *values = event
    names = {"BlockStored": FIELDS, "BlockRemoved": ["block_hashes", "medium", "group_idx"]}.get(kind, [])
    return {"type": kind, **{n: v for n, v in zip(names, values) if v is not None}}


def write(name, batch):
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_bytes(msgpack.packb(batch, use_bin_type=True))


def main():
    prompt = [
        stored([sha(0), sha(1)], None, tokens(2)),
        stored([sha(2)], sha(1), tokens(1, 5000)),
        ["BlockRemoved", [sha(2)], "GPU"],
    ]
    write("tagged_arrays_sha256.msgpack", [1761000000.25, prompt, 0])
    write("maps_sha256.msgpack", {"ts": 1761000000.25, "events": [as_map(e) for e in prompt],
                                  "data_parallel_rank": 1})
    ints = [
        stored([2**63 + 1, 17, -5], None, tokens(3)),
        ["BlockRemoved", [17]],
        ["AllBlocksCleared"],
        stored([99], None, tokens(1, 7)),
    ]
    write("tagged_arrays_int_hashes_no_rank.msgpack", [1761000001.0, ints])
    write("maps_int_hashes.msgpack", {"ts": 1761000001.0, "events": [as_map(e) for e in ints]})
    lora = [
        stored([sha(10), sha(11)], None, tokens(2), lora_id=1, lora_name="sql-adapter",
               extra_keys=[["sql-adapter", "salt-42"], ["sql-adapter"]]),
        stored([sha(12)], sha(11), tokens(1, 9000), lora_id=1, lora_name="sql-adapter",
               extra_keys=[["sql-adapter"]], group_idx=0),
    ]
    write("lora_salt_extra_keys.msgpack", [1761000002.5, lora, 2])
    write("lora_salt_extra_keys_maps.msgpack", {"ts": 1761000002.5, "events": [as_map(e) for e in lora],
                                                "data_parallel_rank": 2})
    hybrid = [
        stored([sha(20)], None, tokens(1), group_idx=0),
        stored([sha(21)], None, tokens(1), group_idx=1),
        stored([sha(22)], None, tokens(1), medium="CPU"),
        ["BlockRemoved", [sha(21)], "GPU", 1],
        ["BlockRemoved", [sha(22)], "CPU"],
    ]
    write("hybrid_groups_and_cpu_tier.msgpack", [1761000003.0, hybrid, 3])
    future = [
        stored([sha(30)], None, tokens(1), trailing=False) + ["a future field", {"nested": [1, 2]}],
        ["BlockEvicted", [sha(30)], "GPU"],
        {"type": "BlockRemoved", "block_hashes": [sha(30)], "reason": "evicted"},
        {"block_hashes": [sha(31)], "type": "BlockRemoved"},
    ]
    write("unknown_fields_and_types.msgpack", [1761000004.0, future, 0, "a future batch field"])
    write("empty_batch.msgpack", [1761000005.0, []])


if __name__ == "__main__":
    main()
