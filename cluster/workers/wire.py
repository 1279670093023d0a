"""How results travel from a worker to the driver: as JSON bytes, many per call.

A pydantic record pickles slowly (a 3-step result of the Mini-SWE agent with its token ids, 11 KB: about 140 µs
to pickle and 170 µs to unpickle); JSON through pydantic-core takes about 100 µs and 150 µs, most of it the
steps' token ids, and records write ``nan``/``inf`` as JSON's ``NaN``/``Infinity`` constants so they load back.
That fast path holds only while ``RolloutResult`` has no Python validator or serializer (one made loading 2.3x
slower): the keys a results.jsonl line derives are ``rollout.store.files.StoredResult``'s. A record holding
something JSON cannot carry (an object in ``metadata``) goes as a pickle instead, so nothing is lost; JSON does
turn tuples into lists, as ``results.jsonl`` does.
"""

from __future__ import annotations

import pickle

from rollout.records import RolloutResult

JSON, PICKLE = 0, 1


def encode_result(result: RolloutResult) -> tuple[int, bytes]:
    try:
        return JSON, result.model_dump_json().encode()
    except Exception:  # noqa: BLE001 - anything JSON cannot carry goes as a pickle
        return PICKLE, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)


def decode_result(encoded: tuple[int, bytes]) -> RolloutResult:
    kind, data = encoded
    if kind == JSON:
        return RolloutResult.model_validate_json(data)
    return pickle.loads(data)
