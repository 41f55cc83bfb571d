"""Word statistics."""
from collections import Counter


def word_count(text):
    """The number of words in text; words are separated by any whitespace."""
    return len(text.split())


def top_words(text, n):
    """The n most frequent words (lowercased) as (word, count) pairs, most frequent first;
    ties in alphabetical order."""
    counts = Counter(w.lower() for w in text.split())
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
