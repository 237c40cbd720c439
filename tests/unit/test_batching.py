import numpy as np

from tests.unit.specs import tokens_spec
from tidepool.runtime.batching import gather, split

SPEC = tokens_spec()


def request(first_id: int, rows: int) -> dict[str, np.ndarray]:
    ids = np.arange(first_id, first_id + rows * 6, dtype=np.int32).reshape(rows, 6)
    return {"IDS": ids, "SCALE": np.full((rows, 1), first_id, dtype=np.float32)}


def test_gather_puts_requests_of_batch_one_and_more_in_order():
    requests = [request(0, 1), request(10, 3), request(50, 2)]
    batch = gather(requests, [1, 3, 2], SPEC)
    assert batch["IDS"].shape == (6, 6) and batch["SCALE"].shape == (6, 1)
    np.testing.assert_array_equal(batch["IDS"], np.concatenate([r["IDS"] for r in requests]))
    np.testing.assert_array_equal(batch["SCALE"][:, 0], [0, 10, 10, 10, 50, 50])


def test_gather_writes_into_the_buffers_the_caller_allocates():
    given = []

    def allocate(shape, dtype):
        given.append(np.full(shape, -7, dtype=dtype))
        return given[-1]

    batch = gather([request(0, 2), request(20, 1)], [2, 1], SPEC, allocate)
    assert batch["IDS"] is given[0] and batch["SCALE"] is given[1]
    assert not (batch["IDS"] == -7).any()


def test_split_gives_each_request_its_own_rows_without_copying():
    outputs = {"OUT": np.arange(12, dtype=np.float32).reshape(6, 2)}
    parts = split(outputs, [1, 3, 2])
    assert [p["OUT"].shape[0] for p in parts] == [1, 3, 2]
    np.testing.assert_array_equal(parts[1]["OUT"], outputs["OUT"][1:4])
    assert np.shares_memory(parts[2]["OUT"], outputs["OUT"])
