"""Image locality on the driver: a rollout goes to a free node that holds its image; a free node is left to a
waiting rollout whose image it holds, and otherwise never left idle."""

from __future__ import annotations

from cluster.placement.locality import ImageLocality
from cluster.placement.slots import Node


def node(name: str, capacity: int = 1, images: set[str] = frozenset(), used: int = 0) -> Node:
    made = Node(name, capacity, actor=object(), used=used)
    made.images = set(images)
    return made


def test_a_rollout_goes_to_the_free_node_that_holds_its_image_over_a_freer_one():
    nodes = [node("a", capacity=4), node("b", capacity=1, images={"img:1"})]
    locality = ImageLocality(lambda task: None)
    assert locality.choose(nodes, "img:1").node_id == "b"
    assert locality.choose(nodes, "img:2").node_id == "a"  # nobody has it: the freest
    assert (locality.hits, locality.misses) == (1, 1)


def test_a_free_node_is_left_to_the_waiting_rollout_whose_image_it_holds():
    a, b = node("a", images={"img:1"}), node("b", used=1)
    locality = ImageLocality()
    locality.wanting["img:1"] += 1  # a rollout of img:1 waits, and is woken in the same round
    assert locality.choose([a, b], "img:2") is None
    locality.wanting["img:1"] -= 1
    assert locality.choose([a, b], "img:2") is a  # nobody wants what it holds: it is not left idle


def test_locality_never_leaves_a_node_idle_that_no_waiting_rollout_wants():
    nodes = [node("a", images={"img:1"}, used=1), node("b", images={"img:9"}), node("c")]
    locality = ImageLocality()
    locality.wanting.update({"img:1": 3})  # they want a, which is busy
    chosen = locality.choose(nodes, "img:2")
    assert chosen is not None and chosen.node_id in ("b", "c")
    locality.sent(chosen, "img:2")
    assert "img:2" in chosen.images  # the rollout fetches or builds it there: the next one of img:2 follows


def test_without_an_image_the_freest_node_is_chosen_and_a_full_cluster_waits():
    nodes = [node("a", capacity=2), node("b", capacity=3)]
    assert ImageLocality().choose(nodes, None).node_id == "b"
    assert ImageLocality().choose([node("a", used=1)], "img:1") is None


def test_a_rollout_whose_image_is_on_a_busy_node_lets_a_new_image_go_first():
    busy, free = node("a", images={"img:1"}, used=1), node("b")
    locality = ImageLocality()
    locality.wanting.update({"img:1": 1, "img:2": 1})  # both wait; img:2 is on no node
    assert locality.choose([busy, free], "img:1") is None  # a second fetch of img:1 would be wasted
    assert locality.choose([busy, free], "img:2") is free  # img:2 must be fetched somewhere anyway
    locality.wanting["img:2"] -= 1
    assert locality.choose([busy, free], "img:1") is free  # nobody else waits: the node is not left idle


def test_a_rollout_is_sent_ahead_only_to_a_full_worker_with_short_attempts_and_room_to_wait():
    from cluster.placement.slots import AHEAD_MAX_SECONDS, queue_on, running

    short, long_, free = node("short", capacity=4, used=4), node("long", capacity=4, used=4), node("free", 4, used=1)
    assert queue_on([short, long_, free], None, None) is None, "no attempt has ended: nobody knows how long they take"
    short.note_seconds(3.0)
    long_.note_seconds(AHEAD_MAX_SECONDS * 5)
    free.note_seconds(1.0)
    assert queue_on([short, long_, free], None, None) is short, "not to a free worker, nor one of long attempts"
    short.used = 8
    assert queue_on([short, long_, free], None, None) is None, "at most one waiting per slot"
    short.used, other = 6, node("other", capacity=4, used=5)
    other.note_seconds(3.0)
    assert queue_on([short, other], None, None) is other, "the shortest wait"
    assert queue_on([short, other], None, "other") is short, "not where its last attempt failed, while another will do"
    short.used = 8  # the other worker has no room to wait: the retry waits on the driver, not back where it failed
    assert queue_on([short, other], None, "other") is None
    assert ImageLocality().choose([short, other, free], None, "free") is None
    short.sick = "its engine does not answer"
    assert queue_on([short, other], None, "other") is other, "no other well node: where it failed is the one left"
    assert queue_on([short, other], "img:1", None) is None, "only where its image is"
    assert running([short, other, free]) == 4 + 4 + 1, "what waits on a worker is not running"
