import java.util.*;
import java.util.concurrent.locks.LockSupport;

public class Work {
    static final Object LOCK = new Object();
    static volatile long sink;

    static long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

    static void contend() {
        synchronized (LOCK) {
            long t = System.nanoTime();
            while (System.nanoTime() - t < 200_000) sink++;
        }
    }

    public static void main(String[] args) throws Exception {
        long end = System.currentTimeMillis() + Long.parseLong(args[0]);
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            final int id = i;
            Thread t = new Thread(() -> {
                List<byte[]> keep = new ArrayList<>();
                Runnable r = () -> sink += fib(18);
                while (System.currentTimeMillis() < end) {
                    r.run();
                    keep.add(new byte[id == 0 ? 100_000 : 64]);
                    if (keep.size() > 500) keep.clear();
                    contend();
                    LockSupport.parkNanos(50_000);
                    sink += String.valueOf(sink).hashCode();
                }
            }, "worker-" + i);
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) t.join();
    }
}
