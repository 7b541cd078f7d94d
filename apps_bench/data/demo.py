"""Two built-in problems, written for apps-bench: one standard-input, one call-based.

They let every runner and the judge run end to end with no dataset at all
(`dataset=demo`), and they exercise both judging modes.
"""

from __future__ import annotations

from apps_bench.types import Problem, TestSuite

_STDIN_QUESTION = """\
You are given n integers. Print the sum of the even ones and the number of odd ones,
separated by a space.

-----Input-----

The first line contains an integer n (1 <= n <= 10^5). The second line contains n
integers a_1, ..., a_n (|a_i| <= 10^9).

-----Output-----

Print two integers: the sum of the even a_i, then how many a_i are odd.

-----Examples-----
Input
5
1 2 3 4 5

Output
6 3
"""

_STDIN_SOLUTION = """\
n = int(input())
a = list(map(int, input().split()))
print(sum(x for x in a if x % 2 == 0), sum(1 for x in a if x % 2))
"""

_CALL_QUESTION = """\
Given a list of integers nums and an integer k, return the k most frequent values,
most frequent first; values with equal frequency are ordered by value, smallest first.

Example 1:
Input: nums = [1,1,1,2,2,3], k = 2
Output: [1,2]

Example 2:
Input: nums = [4,4,5,5,6], k = 3
Output: [4,5,6]

Constraints:
1 <= k <= number of distinct values in nums <= 10^4
"""

_CALL_STARTER = """\
class Solution:
    def topKFrequent(self, nums: List[int], k: int) -> List[int]:
        """

_CALL_SOLUTION = """\
from collections import Counter
from typing import List


class Solution:
    def topKFrequent(self, nums: List[int], k: int) -> List[int]:
        counts = Counter(nums)
        return sorted(counts, key=lambda v: (-counts[v], v))[:k]
"""

DEMO_PROBLEMS: tuple[Problem, ...] = (
    Problem(
        id="demo-stdin",
        question=_STDIN_QUESTION,
        tests=TestSuite(
            inputs=("5\n1 2 3 4 5\n", "1\n7\n", "4\n-2 -4 10 0\n", "3\n1000000000 999999999 -1000000000\n"),
            outputs=("6 3\n", "0 1\n", "4 0\n", "0 1\n"),
            fn_name=None,
            n_available=4,
        ),
        difficulty="introductory",
        solutions=(_STDIN_SOLUTION,),
        split="demo",
    ),
    Problem(
        id="demo-call",
        question=_CALL_QUESTION,
        tests=TestSuite(
            inputs=([[1, 1, 1, 2, 2, 3], 2], [[4, 4, 5, 5, 6], 3], [[7], 1], [[3, 1, 2, 2, 1, 3], 2]),
            outputs=([[1, 2]], [[4, 5, 6]], [[7]], [[1, 2]]),
            fn_name="topKFrequent",
            n_available=4,
        ),
        starter_code=_CALL_STARTER,
        difficulty="introductory",
        solutions=(_CALL_SOLUTION,),
        split="demo",
    ),
)
