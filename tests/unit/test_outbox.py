"""The executor's deltas reach the HTTP front end's loop in order, batched into few wake-ups."""
import asyncio
import threading

from rose.runtime.coserve.outbox import Outbox


def test_items_from_another_thread_arrive_in_order_with_one_wake_up_per_batch():
    async def main():
        loop = asyncio.get_running_loop()
        box = Outbox(loop)
        got = []
        done = asyncio.Event()

        def producer():
            for step in range(50):  # a serving step's deltas, put back to back
                for i in range(20):
                    box.put(got.append, (step, i))
            box.put(done.set)

        t = threading.Thread(target=producer)
        t.start()
        await asyncio.wait_for(done.wait(), 10)
        t.join()
        assert got == [(s, i) for s in range(50) for i in range(20)]  # nothing lost, nothing reordered
        assert box.flushes < 1001  # puts that found a flush pending joined it (1001 puts in all)

    asyncio.run(main())


def test_a_closed_loop_drops_items_instead_of_raising_on_the_executor_thread():
    loop = asyncio.new_event_loop()
    box = Outbox(loop)
    loop.close()
    box.put(print, "never")  # must not raise: the executor thread goes on serving
    box.put(print, "never")
    assert box._items == []
