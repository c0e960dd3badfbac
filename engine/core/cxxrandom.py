"""std::mt19937 and the two libstdc++ algorithms ggml's C++ code draws from it.

llama.cpp's sampler draws `std::uniform_real_distribution<double>` values, ggml-opt shuffles its
dataset with `std::shuffle`; both results are fixed by libstdc++'s code, not by the C++ standard,
so they are reproduced here as GCC 11+ computes them:

* a uniform double is generate_canonical: two 32-bit outputs, (lo + hi * 2^32) / 2^64;
* a uniform integer in [0, n) (n < 2^32) is Lemire's multiply-and-shift: the 64-bit product of
  one output and n, its high half the result, redrawn while its low half falls under
  (2^32 - n) mod n;
* std::shuffle swaps each element i (from the second on) with one at a position in [0, i];
  when n*n fits in the generator's range it draws two positions with one integer (x // (i+2),
  x % (i+2) from [0, (i+1)(i+2))), after one single swap up front when n is even.
"""

from __future__ import annotations

import numpy as np

TWO_32 = float(1 << 32)
URNG_RANGE = (1 << 32) - 1  # std::mt19937::max() - min()


class Mt19937:
    """std::mt19937(seed); the default seed is the standard's 5489."""

    def __init__(self, seed: int = 5489) -> None:
        self.seed = int(seed) & 0xFFFFFFFF
        self._mt = np.random.MT19937()
        self._mt._legacy_seeding(self.seed)  # init_genrand(seed): std::mt19937(seed)'s state

    def __call__(self) -> int:
        """One 32-bit output."""
        return int(self._mt.random_raw())

    def uniform(self) -> float:
        """std::uniform_real_distribution<double>(0, 1): generate_canonical from two outputs."""
        lo, hi = (float(x) for x in self._mt.random_raw(2))
        r = (lo + hi * TWO_32) / (TWO_32 * TWO_32)
        return r if r < 1.0 else float(np.nextafter(1.0, 0.0))

    def below(self, n: int) -> int:
        """std::uniform_int_distribution{0, n - 1}: an integer in [0, n), 1 <= n <= 2^32."""
        if n - 1 == URNG_RANGE:
            return self()
        product = self() * n
        low = product & 0xFFFFFFFF
        if low < n:
            threshold = ((1 << 32) - n) % n
            while low < threshold:
                product = self() * n
                low = product & 0xFFFFFFFF
        return product >> 32

    def shuffle(self, items: list, end: int | None = None) -> None:
        """std::shuffle(items.begin(), items.begin() + end, *this), in place."""
        n = len(items) if end is None else end
        if n == 0:
            return
        if URNG_RANGE // n >= n:
            i = 1
            if n % 2 == 0:
                j = self.below(2)
                items[i], items[j] = items[j], items[i]
                i += 1
            while i != n:
                b0 = i + 1
                x = self.below(b0 * (b0 + 1))
                for j in (x // (b0 + 1), x % (b0 + 1)):
                    items[i], items[j] = items[j], items[i]
                    i += 1
            return
        for i in range(1, n):  # 65536 elements or more: one draw per swap
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]
