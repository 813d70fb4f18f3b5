"""The words that make a question ask: its question words, the words after which one asks
("tell me why"), and the words after which "to" starts a verb rather than points somewhere.
Read by pair_text.asked_words and the question-word, another-fact and direction vetoes."""

from gateway.cache.lexicon import word_list

# Words after which "to" starts a verb ("how to read a CSV"), so it points nowhere: the
# direction veto reads the "to" of "a dict to JSON", not of "how to".
INFINITIVE_LEADS = frozenset(
    word_list(
        """how what where when whether which who want need way ways best try trying able going
        have has had used like"""
    )
)

QUESTION_WORDS = frozenset({"who", "whom", "when", "where", "why", "what", "how", "which", "whose"})
# A switch between these asks for another fact (when vs where was it founded).
DISTINCT_QUESTION_WORDS = frozenset({"who", "whom", "when", "where", "why", "whose"})
# A question word after these asks ("tell me why", "not sure when"); elsewhere in a
# sentence it joins clauses ("it crashes when I open it") and asks nothing.
ASKING_WORDS = frozenset(
    word_list(
        """me us know explain wondering wonder understand tell ask asking show idea sure
        curious about on"""
    )
)
