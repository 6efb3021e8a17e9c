"""PyTorch processes sharing CUDA memory through torch.multiprocessing (CUDA IPC) on the fake GPU.

`fw_torch_ipc.py MIB OWN_MIB MORE_MIB HOLD_S` (this process is the producer):
- the producer fills a MIB MiB int32 tensor from the host (kernels do not compute on the fake;
  copies move real bytes), moves it to the GPU and passes it to a consumer process (spawned);
- the consumer rebuilds it (cudaIpcOpenMemHandle, cudaIpcOpenEventHandle), reports
  `mem_get_info` before its own allocations, reads the tensor back and compares every value,
  then allocates OWN_MIB MiB of its own and tries MORE_MIB MiB more (0: not);
- both hold their memory HOLD_S seconds (a monitor audits them meanwhile), then the consumer
  drops the tensor and exits, then the producer.

Prints one JSON line: the producer's and the consumer's reports and the consumer's exit code.
"""
import os
import sys
import time

import torch
import torch.multiprocessing as mp

from fw_common import MI, emit, failure


def pattern(n):
    return torch.arange(n, dtype=torch.int32) * 7 + 3


def info():
    free, total = torch.cuda.mem_get_info()
    return dict(free=free, total=total)


def consumer(inbox, outbox, own_mib, more_mib):
    try:
        t = inbox.get()  # rebuilt here from the producer's IPC handles
        before = info()
        back = t.cpu()
        read_ok = bool(torch.equal(back, pattern(t.numel())))
        own = torch.empty(own_mib * MI, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        after_own = info()
        more, more_error = None, None
        if more_mib:
            try:
                more = torch.empty(more_mib * MI, dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
            except Exception as e:
                more_error = failure(e, torch.cuda.OutOfMemoryError, "OutOfMemoryError")
        outbox.put(dict(pid=os.getpid(), read_ok=read_ok, numel=t.numel(), before=before,
                        after_own=after_own, after_more=info(), more_error=more_error,
                        reserved=torch.cuda.memory_reserved()))
        inbox.get()  # the producer's "done": hold everything until then
        del t, own, more, back
        torch.cuda.synchronize()
    except Exception as e:
        outbox.put(dict(error=failure(e)))
        raise


def main():
    mib, own_mib, more_mib, hold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    ctx = mp.get_context("spawn")
    before = info()
    t = pattern(mib * MI // 4).to("cuda")
    torch.cuda.synchronize()
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(inbox, outbox, own_mib, more_mib))
    p.start()
    inbox.put(t)
    got = outbox.get(timeout=600)
    shared = info()
    time.sleep(hold)
    inbox.put("done")
    p.join(timeout=300)
    emit(producer=dict(pid=os.getpid(), before=before, shared=shared,
                       reserved=torch.cuda.memory_reserved()),
         consumer=got, consumer_exit=p.exitcode)


if __name__ == "__main__":
    main()
