"""Built-in prompt sets for `python -m specjax train data --prompts builtin:NAME`: questions a
chat model is asked, made from templates and topics (no chat data set is reachable offline).
The shipped SmolLM2 drafters' data was made from these (`scripts/_corpus.py` imports them).

    from specjax.train import prompts
    prompts.builtin("chat")     # the training questions, then EVAL_QUESTIONS (the last 10)

`EVAL_QUESTIONS` are held out: no template makes them and none of their topics is in a list, so
the acceptance measured on them is that of unseen questions. "chat" ends with them, so that
`--held-out 10` evaluates a drafter on the questions the shipped drafters' cards report.
"""

from __future__ import annotations

import random

__all__ = ["BUILTIN", "EVAL_QUESTIONS", "builtin", "chat_questions"]

CONCEPTS = [
    "photosynthesis", "the water cycle", "inflation", "compound interest", "machine learning",
    "a black hole", "DNA replication", "the French Revolution", "supply and demand",
    "climate change", "the immune system", "blockchain", "quantum computing",
    "the theory of evolution", "plate tectonics", "the stock market", "recursion in programming",
    "object-oriented programming", "the Pythagorean theorem", "gravity", "the internet",
    "vaccines", "renewable energy", "the greenhouse effect", "democracy", "the Roman Empire",
    "the scientific method", "probability", "neural networks", "encryption", "cloud computing",
    "the human heart", "sleep", "meditation", "the Renaissance", "the Industrial Revolution",
    "nuclear fusion", "electric cars", "the phases of the moon", "ocean tides", "rainbows",
    "volcanoes", "earthquakes", "antibiotics", "the solar system", "a hash table",
    "version control with git", "an API", "a database index", "the speed of light", "entropy",
    "opportunity cost", "the Big Bang", "the printing press", "artificial intelligence",
]
CONCEPT_TEMPLATES = [
    "What is {}?", "Explain {} in simple terms.", "Can you explain {} to a ten-year-old?",
    "Why is {} important?", "Give me three facts about {}.", "Write a short paragraph about {}.",
    "What are common misconceptions about {}?",
]
TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string",
    "merges two sorted lists", "removes duplicates from a list",
    "finds the largest element in a list", "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "reads a text file and counts its words",
    "flattens a nested list", "computes the average of a list of numbers",
    "sorts a list of dictionaries by a key", "returns the common elements of two lists",
    "validates an email address", "computes the greatest common divisor of two numbers",
    "generates a random password", "capitalizes every word in a sentence",
    "checks whether two strings are anagrams", "sums the digits of an integer",
    "finds the second largest number in a list", "counts word frequencies in a text",
    "converts a binary string to an integer", "transposes a matrix", "implements binary search",
    "implements bubble sort", "parses a line of CSV into fields",
    "returns the squares of the even numbers in a list", "checks whether a year is a leap year",
]
TASK_TEMPLATES = ["Write a Python function that {}.", "How do I write a Python function that {}?",
                   "Show me Python code that {}."]
ACTIVITIES = [
    "learning a new language", "working from home", "improving my sleep", "saving money",
    "studying for exams", "writing an essay", "public speaking", "starting a vegetable garden",
    "training for a marathon", "cooking healthy meals on a budget", "managing stress",
    "learning to program", "preparing for a job interview", "traveling on a budget",
    "keeping houseplants alive", "taking better photos", "reading more books",
    "making friends in a new city", "writing clean code", "staying motivated to exercise",
]
ACTIVITY_TEMPLATES = ["Give me five tips for {}.", "What is the best way to get started with {}?",
                       "What are common mistakes people make when {}?"]
THINGS = ["the ocean", "autumn", "a cat", "friendship", "a city at night", "a robot", "coffee",
           "the mountains", "rain", "the stars", "a lighthouse", "time", "a library", "winter",
           "a dragon"]
THING_TEMPLATES = ["Write a short poem about {}.", "Write a haiku about {}.",
                    "Write a short story about {}.", "Describe {} in three sentences."]
COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Australia", "Egypt", "India", "Germany",
              "Mexico", "Kenya", "Italy", "Spain", "Argentina", "Norway", "Thailand", "Peru",
              "Turkey", "Poland", "Vietnam", "Morocco"]
SENTENCES = ["Where is the train station?", "I would like a cup of coffee.",
              "The weather is nice today.", "How much does this cost?", "Thank you very much.",
              "My name is Anna and I live in London.", "Can you help me, please?",
              "I am learning to cook."]
LANGUAGES = ["French", "Spanish", "German"]
PAIRS = [("Python", "JavaScript"), ("cats", "dogs"), ("tea", "coffee"), ("renting", "buying a home"),
          ("TCP", "UDP"), ("lists", "tuples in Python"), ("SQL", "NoSQL databases"),
          ("solar power", "wind power"), ("viruses", "bacteria"), ("running", "swimming")]

EVAL_QUESTIONS = [
    "What are the main differences between a violin and a viola?",
    "Write a Python function that returns the median of a list of numbers.",
    "How does a refrigerator keep food cold?",
    "Give me a simple recipe for pancakes.",
    "Why do leaves change color in the fall?",
    "Explain what a linked list is and when to use one.",
    "Write a limerick about a forgetful wizard.",
    "What should I consider when choosing a laptop for college?",
    "How do bees make honey?",
    "Describe the main causes of World War I.",
]

def chat_questions() -> list[str]:
    """Every training question the templates make, in a fixed order (several hundred)."""
    questions = [t.format(c) for c in CONCEPTS for t in CONCEPT_TEMPLATES]
    questions += [t.format(c) for c in TASKS for t in TASK_TEMPLATES]
    questions += [t.format(c) for c in ACTIVITIES for t in ACTIVITY_TEMPLATES]
    questions += [t.format(c) for c in THINGS for t in THING_TEMPLATES]
    questions += [f"What is the capital of {c}?" for c in COUNTRIES]
    questions += [f"Tell me about the history of {c}." for c in COUNTRIES]
    questions += [f"Translate '{s}' into {lang}." for s in SENTENCES for lang in LANGUAGES]
    questions += [f"Compare {a} and {b}." for a, b in PAIRS]
    questions += [f"What are the pros and cons of {a} versus {b}?" for a, b in PAIRS]
    numbers = random.Random(0)
    for _ in range(30):
        a, b = numbers.randint(2, 99), numbers.randint(2, 99)
        questions.append(f"What is {a} {numbers.choice('+-*')} {b}? Explain your steps.")
    assert not set(questions) & set(EVAL_QUESTIONS)
    return questions


BUILTIN = {"chat": "the training questions (chat_questions), then the 10 EVAL_QUESTIONS"}


def builtin(name: str) -> list[str]:
    """The prompts of a built-in set (BUILTIN names them); chat sets are plain questions, to be
    rendered in the target's chat template."""
    if name == "chat":
        return chat_questions() + EVAL_QUESTIONS
    raise ValueError(f"unknown built-in prompt set {name!r}: expected one of "
                     f"{', '.join(sorted(BUILTIN))}")
