import pytest

from tidepool.pool.buddy import BuddyAllocator


def test_blocks_split_and_merge_back_into_the_whole_arena():
    buddy = BuddyAllocator(1 << 20, min_block=1 << 16)
    offsets = [buddy.allocate(1 << 16) for _ in range(16)]
    assert sorted(offsets) == [i << 16 for i in range(16)]
    assert buddy.allocate(1) is None and buddy.largest_free() == 0
    for offset in offsets[::2] + offsets[1::2]:
        buddy.release(offset)
    assert buddy.empty and buddy.largest_free() == 1 << 20


def test_a_pure_allocation_sequence_never_fragments():
    # Free space is a set of distinct powers of two: any request that fits in bytes fits in a block.
    buddy = BuddyAllocator(1 << 24, min_block=1 << 16)
    for size in [1 << 16, 1 << 23, 1 << 18, 1 << 22, 1 << 17, 1 << 21]:
        assert buddy.allocate(size) is not None
    assert buddy.used_bytes == sum([1 << 16, 1 << 23, 1 << 18, 1 << 22, 1 << 17, 1 << 21])


def test_requests_round_up_to_the_minimum_block_and_too_large_ones_fail():
    buddy = BuddyAllocator(1 << 20, min_block=1 << 16)
    assert buddy.allocate(10) == 0 and buddy.used_bytes == 1 << 16
    assert buddy.allocate((1 << 20) + 1) is None


def test_sizes_must_be_powers_of_two():
    with pytest.raises(ValueError, match="powers of two"):
        BuddyAllocator(3 << 20, min_block=1 << 16)
