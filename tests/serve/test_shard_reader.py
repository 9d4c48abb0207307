"""The direct row reader equals tensorstore on the export's layout, checks every chunk, and
declines any other layout."""

import numpy as np
import pytest
import tensorstore as ts

from scone_jax.artifacts.table_store import create_array, open_array, parse_location, quantize
from scone_jax.errors import UserError
from scone_jax.serve.shard_reader import ShardReader


def write_rows(tmp_path, dtype, rows, width, chunk_rows, shard_rows, rng):
    loc = parse_location(str(tmp_path / dtype))
    stored, _ = quantize(rng.normal(size=(rows, width)).astype(np.float32), dtype)
    create_array(loc, "rows", (rows, width), dtype, chunk_rows, shard_rows)[...].write(
        stored
    ).result()
    return loc, open_array(loc, "rows")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_direct_reads_equal_tensorstore(tmp_path, dtype, rng):
    rows, width = int(rng.integers(300, 3000)), int(rng.integers(1, 40))
    chunk_rows = int(rng.choice([1, 8, 64]))
    loc, array = write_rows(
        tmp_path, dtype, rows, width, chunk_rows, chunk_rows * int(rng.integers(1, 9)), rng
    )
    reader = ShardReader.for_array(array, loc.local_path / "rows")
    assert reader is not None
    ids = np.unique(rng.integers(0, rows, int(rng.integers(1, 200))))
    ids = np.unique(np.r_[ids, 0, rows - 1])  # the first and the last (partial shard) rows too
    expected = np.asarray(array.oindex[ids].read().result())
    np.testing.assert_array_equal(reader.read(ids), expected)
    for i in rng.permutation(len(ids))[:20]:  # the one-row path of a decode step
        np.testing.assert_array_equal(reader.read_row(int(ids[i])), expected[i])


def test_a_flipped_byte_in_a_chunk_or_index_is_refused(tmp_path, rng):
    loc, array = write_rows(tmp_path, "float32", 256, 8, 16, 128, rng)
    shard = loc.local_path / "rows" / "c" / "1" / "0"
    original = shard.read_bytes()
    for where in (
        int(rng.integers(0, 16 * 8 * 4)),
        len(original) - 10,
    ):  # a chunk's rows, the index
        data = bytearray(original)
        data[where] ^= 0x10
        shard.write_bytes(bytes(data))
        reader = ShardReader.for_array(array, loc.local_path / "rows")
        for read, arg in (
            (reader.read, np.arange(128, 256)),
            (reader.read_row, 128 + where // 32 % 16),
        ):
            with pytest.raises(UserError, match="fails its crc32c check") as caught:
                read(arg)
            assert str(shard) in str(caught.value) and "\n" not in str(caught.value)


def test_other_layouts_and_remote_tables_use_tensorstore(tmp_path):
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(tmp_path / "plain") + "/"},
        "metadata": {
            "shape": [64, 4],
            "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16, 4]}},
        },
        "create": True,
    }
    plain = ts.open(spec).result()  # unsharded: not the export's layout
    assert ShardReader.for_array(plain, tmp_path / "plain") is None
    assert ShardReader.for_array(plain, None) is None
