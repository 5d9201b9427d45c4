"""Deterministic prompts for engine tests and benchmarks on the default model."""

from __future__ import annotations

TOPICS = ["the water cycle", "how vaccines work", "the history of the printing press", "black holes",
          "photosynthesis", "the French revolution", "how a compiler works", "plate tectonics",
          "the stock market", "machine learning", "the human heart", "renewable energy"]


def varied_questions(count: int) -> list[str]:
    """Short and long questions; every third one carries a few hundred tokens of context (chunked at budget 64)."""
    questions = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        if i % 3 == 2:
            context = " ".join(f"Fact {k}: {topic} is discussed in chapter {k} of the course, with examples."
                               for k in range(1, 8 + i % 5))
            questions.append(f"Read these notes and summarise them in one sentence. {context}")
        else:
            questions.append(f"In two sentences, explain {topic}." if i % 2 else f"What is {topic}?")
    return questions


def policy_system_prompt(num_clauses: int = 40) -> str:
    """A long shared system prompt (about 25 tokens a clause), like the seed's policy assistant."""
    clauses = [f"Clause {k}: customers who purchased plan {chr(65 + k % 26)} may request a refund within "
               f"{10 + k} days, provided the order number ends in {k % 10} and the item is unused."
               for k in range(1, num_clauses + 1)]
    return "You are a policy assistant for Acme Corp. Answer strictly from the policy below.\n" + "\n".join(clauses)


POLICY_QUESTIONS = ["Can I get a refund for plan C after 12 days?", "What does clause 7 say?",
                    "Is an opened item refundable?", "How long do plan Z customers have?",
                    "Which clause covers order numbers ending in 3?", "Summarise the refund policy.",
                    "Can I return a used item?", "What is the longest refund window?",
                    "Does clause 20 apply to plan U?", "Who wrote this policy?",
                    "What should I do if my order number ends in 9?", "Is there any clause about shipping?"]
