"""Built-in prompt sets for `python -m specjax train data --prompts builtin:NAME`, made offline
and deterministically (no chat data set is reachable offline):

  chat       questions a chat model is asked, made from templates and topics, in the target's
             chat template; the shipped SmolLM2 drafters' chat data came from them;
  chat-wide  chat's questions and several thousand more on other topics and tasks: the chat
             part of data/eagle2, the shipped EAGLE drafter's data;
  code       prompts cut from this Python's standard library (`specjax.train.stdlib`);
  prose      plain-text openings to continue: articles, stories, letters, reviews.

    from specjax.train import prompts
    prompts.builtin("chat")     # the training questions, then EVAL_QUESTIONS (the last 10)

`EVAL_QUESTIONS` are held out: no template makes them, none of their topics is in a list, and
no question or opening of the wider sets names one (`check_excluded`, tested), so the
acceptance measured on them is that of unseen questions. The chat sets end with them, so that
`--held-out 10` evaluates a drafter on the questions the shipped drafters' cards report.
"""

from __future__ import annotations

import random
import re

from specjax.train import stdlib

__all__ = ["BUILTIN", "EVAL_QUESTIONS", "EVAL_TOPIC_WORDS", "builtin", "chat_questions",
           "check_excluded", "more_chat_questions", "prose_prompts"]

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
PAIRS = [("Python", "JavaScript"), ("cats", "dogs"), ("tea", "coffee"),
         ("renting", "buying a home"),
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


# Words naming the topics of EVAL_QUESTIONS; a question made here may not contain one
# (as a whole word, any case), so that those questions' topics stay out of the training data.
EVAL_TOPIC_WORDS = ["violin", "viola", "median", "refrigerator", "fridge", "pancake",
                    "pancakes", "recipe", "leaves", "fall foliage", "linked list", "limerick",
                    "wizard", "laptop", "college", "bee", "bees", "honey",
                    "World War I", "WWI", "First World War"]

# -- The wider chat set (chat-wide) -------------------------------------------------------------

_TOPICS = [  # explained, compared, summarized (none is in the chat set's lists)
    "osmosis", "the Doppler effect", "magnetism", "static electricity", "the periodic table",
    "chemical bonds", "erosion", "the nitrogen cycle", "cell division", "the placebo effect",
    "natural selection", "the carbon cycle", "sound waves", "friction", "buoyancy",
    "lightning", "hurricanes", "glaciers", "coral reefs", "the ozone layer", "metabolism",
    "hormones", "the nervous system", "allergies", "exoplanets", "dark matter", "the Milky Way",
    "comets", "solar eclipses", "semiconductors", "lasers", "GPS", "batteries", "3D printing",
    "nuclear fission", "genetic engineering", "stem cells", "the gut microbiome", "tsunamis",
    "deserts", "rainforests", "taxes", "interest rates", "unemployment", "globalization",
    "the minimum wage", "credit scores", "a budget deficit", "cryptocurrency", "insurance",
    "index funds", "the United Nations", "human rights", "copyright", "urbanization",
    "a compiler", "garbage collection", "a REST API", "unit testing", "Docker containers",
    "regular expressions", "Big O notation", "a binary tree", "dynamic programming",
    "a stack data structure", "a queue", "caching", "DNS", "HTTPS", "public-key cryptography",
    "a virtual machine", "an operating system", "sorting algorithms", "functional programming",
    "static typing", "the ancient Egyptian pyramids", "the Silk Road", "the Cold War",
    "the Apollo moon landing", "the Great Wall of China", "the Olympic Games", "impressionism",
    "jazz", "the Magna Carta", "the Maya civilization", "the invention of the telephone",
    "the abolition of slavery", "the printing of money", "supply chains", "biodiversity",
    "recycling", "composting", "the circulatory system", "vitamins", "the human eye",
    "muscle memory", "habit formation", "critical thinking", "game theory", "statistics",
    "the Fibonacci sequence", "prime numbers", "fractions", "logarithms", "matrices",
]
_TOPIC_TEMPLATES = [
    "How does {} work?", "Explain {} like I'm a beginner.",
    "What are the most important things to know about {}?",
    "Write a short explanation of {} for a school newsletter.",
    "Give me an analogy that explains {}.", "Summarize the key ideas behind {}.",
    "What is the history of {}?", "Why should a student learn about {}?",
    "Write three quiz questions about {}, with answers.",
]
_CODE_TASKS = [  # none is one of the chat set's Python tasks
    "reverses the words in a sentence", "returns the n-th prime number",
    "counts the lines of a file that contain a given word", "rotates a list by k positions",
    "checks whether parentheses in a string are balanced", "converts a Roman numeral to an integer",
    "groups a list of words by their first letter", "finds the longest common prefix of strings",
    "computes the running total of a list", "splits a list into chunks of size n",
    "returns the mode of a list of numbers", "checks whether a number is a perfect square",
    "converts an integer to its binary representation", "merges two dictionaries",
    "finds all pairs in a list that sum to a target", "removes all whitespace from a string",
    "returns the intersection of two sets of strings", "computes the dot product of two vectors",
    "generates the first n rows of Pascal's triangle", "counts the occurrences of each character",
    "implements a simple stack class", "parses a date string in YYYY-MM-DD format",
    "shuffles a list in place", "computes the Levenshtein distance of two strings",
    "converts kilometres to miles",
]
_LANGUAGES = ["Python", "JavaScript", "Java", "C", "C++", "Go", "Rust", "TypeScript"]
_CODE_TEMPLATES = ["Write a {lang} function that {task}.",
                   "Show me how to write {lang} code that {task}.",
                   "In {lang}, how would I write a function that {task}?"]
_SQL_TASKS = [
    "selects every customer from Canada", "counts the orders of each customer",
    "finds the ten most expensive products", "joins the orders and customers tables",
    "deletes users who never logged in", "computes the average salary by department",
    "finds duplicate email addresses", "lists employees hired after 2020",
]
_SHELL_TASKS = [
    "finds every file larger than 100 MB", "counts the lines of all .py files in a directory",
    "renames every .txt file to .md", "prints the ten largest directories",
    "backs up a folder into a dated archive", "shows which process uses port 8080",
]
_WRITING = [  # (template, fillers)
    ("Write a polite email to my {} asking for {}.",
     [("manager", "a day off"), ("landlord", "a repair in the kitchen"),
      ("teacher", "an extension on my homework"), ("neighbour", "help with my garden"),
      ("colleague", "feedback on my report"), ("bank", "a copy of my statement")]),
    ("Write a short product description for {} aimed at {}.",
     [("a water bottle", "hikers"), ("a desk lamp", "students"), ("a backpack", "travellers"),
      ("a pair of running shoes", "beginners"), ("a coffee grinder", "home baristas"),
      ("a board game", "families"), ("noise-cancelling headphones", "commuters")]),
    ("Write a short speech for {} that mentions {}.",
     [("a wedding", "how the couple met"), ("a retirement party", "thirty years of work"),
      ("a graduation", "the value of curiosity"), ("a team's last match", "never giving up"),
      ("a birthday", "a shared childhood memory")]),
    ("Write a thank-you note to {} for {}.",
     [("my grandmother", "a knitted scarf"), ("a coworker", "covering my shift"),
      ("a friend", "helping me move"), ("my doctor", "her patience"),
      ("a teacher", "a year of encouragement")]),
]
_GOALS = [
    "wake up earlier", "learn to touch type", "become a better listener", "drink more water",
    "spend less time on my phone", "organize my closet", "learn to play the guitar",
    "improve my handwriting", "get better at chess", "negotiate a higher salary",
    "make my presentations more engaging", "keep a journal", "reduce food waste",
    "learn to swim as an adult", "plan a road trip", "prepare for a job interview in tech",
    "become more productive in the morning", "write a resume", "start running",
    "take care of a puppy", "stay focused while studying", "keep my apartment clean",
]
_GOAL_TEMPLATES = ["How can I {}?", "Make a one-week plan to help me {}.",
                   "What mistakes should I avoid when I try to {}?"]
_WORDS = ["serendipity", "ephemeral", "ubiquitous", "meticulous", "resilient", "ambiguous",
          "pragmatic", "eloquent", "nostalgia", "candid", "frugal", "tenacious", "whimsical",
          "benevolent", "cryptic", "diligent", "gregarious", "lucid", "mundane", "paradox"]
_WORD_TEMPLATES = ["What does the word '{}' mean?",
                   "Use the word '{}' in three different sentences.",
                   "What are some synonyms for '{}'?"]
_TO_EDIT = [
    "me and him goes to the store every day", "their going to be late for the meeting",
    "the results was better then we expected", "she dont like waiting in long lines",
    "we was planning to visit the museum tomorrow", "the dog chased it's own tail",
    "I could of finished the project sooner", "less people came to the party this year",
]
_TO_REWRITE = [
    "The meeting is moved to Friday because a lot of people can't come on Thursday.",
    "Our new app helps you find parking spots in busy cities.",
    "The park will be closed next week for repairs.",
    "I think we should hire more people so the team is less tired.",
    "The train was late again and I missed the start of the show.",
    "Please remember to switch off the lights when you leave the office.",
]
_REWRITE_TEMPLATES = ["Rewrite this sentence to sound more formal: \"{}\"",
                      "Rewrite this sentence for a ten-year-old: \"{}\"",
                      "Make this sentence shorter: \"{}\""]
_PEOPLE = ["Marie Curie", "Leonardo da Vinci", "Ada Lovelace", "Isaac Newton", "Cleopatra",
           "Nelson Mandela", "Galileo Galilei", "Frida Kahlo", "Alan Turing", "Confucius",
           "Charles Darwin", "Amelia Earhart", "Wolfgang Amadeus Mozart", "Rosalind Franklin",
           "Mahatma Gandhi", "Nikola Tesla", "Jane Austen", "Genghis Khan"]
_PEOPLE_TEMPLATES = ["Who was {}?", "What is {} best known for?",
                     "Write a short biography of {}."]
_ANIMALS = ["an octopus", "a penguin", "a giraffe", "a dolphin", "an owl", "a tortoise",
            "a chameleon", "a wolf", "a camel", "an elephant", "a salmon", "a bat"]
_ANIMAL_TEMPLATES = ["What are some surprising facts about {}?",
                     "Where does {} live and what does it eat?",
                     "Write a children's story about {} who makes a new friend."]


def _arithmetic_questions(rng: random.Random, n: int) -> list[str]:
    """Word problems with numbers from `rng` (a fixed seed, so a fixed list)."""
    shapes = [
        lambda: f"A train travels {rng.randint(60, 480)} km in {rng.randint(2, 6)} hours. "
                "What is its average speed?",
        lambda: f"A shirt costs ${rng.randint(15, 90)} and is {rng.choice([10, 15, 20, 25, 30])}% "
                "off. What is the sale price?",
        lambda: f"Solve for x: {rng.randint(2, 9)}x + {rng.randint(1, 30)} = "
                f"{rng.randint(31, 99)}.",
        lambda: f"If I save ${rng.randint(5, 50)} a week, how much will I have after "
                f"{rng.randint(6, 52)} weeks?",
        lambda: f"A rectangle is {rng.randint(3, 40)} cm long and {rng.randint(2, 30)} cm wide. "
                "What are its area and perimeter?",
        lambda: f"What is {rng.randint(11, 99)}% of {rng.randint(100, 900)}?",
        lambda: f"Convert {rng.randint(1, 12)} hours and {rng.randint(1, 59)} minutes into "
                "minutes.",
    ]
    return [rng.choice(shapes)() for _ in range(n)]


def more_chat_questions() -> list[str]:
    """The questions this module adds to `chat_questions()`, in a fixed order."""
    questions = [t.format(c) for c in _TOPICS for t in _TOPIC_TEMPLATES]
    # the chat set's templates too, but for "What is {}?" and "Why is {} important?", which many of
    # these topics (plurals) would make ungrammatical.
    questions += [t.format(c) for c in _TOPICS for t in CONCEPT_TEMPLATES
                  if t not in ("What is {}?", "Why is {} important?")]
    questions += [t.format(lang=lang, task=task) for task in _CODE_TASKS
                  for lang in _LANGUAGES for t in _CODE_TEMPLATES]
    questions += [f"Write an SQL query that {t}." for t in _SQL_TASKS]
    questions += [f"Write a Bash command that {t}." for t in _SHELL_TASKS]
    questions += [template.format(*f) for template, fills in _WRITING for f in fills]
    questions += [t.format(g) for g in _GOALS for t in _GOAL_TEMPLATES]
    questions += [t.format(w) for w in _WORDS for t in _WORD_TEMPLATES]
    questions += [f"Correct the grammar in this sentence: \"{s}\"" for s in _TO_EDIT]
    questions += [t.format(s) for s in _TO_REWRITE for t in _REWRITE_TEMPLATES]
    questions += [t.format(p) for p in _PEOPLE for t in _PEOPLE_TEMPLATES]
    questions += [t.format(a) for a in _ANIMALS for t in _ANIMAL_TEMPLATES]
    questions += _arithmetic_questions(random.Random(1), 60)
    return list(dict.fromkeys(questions))      # each once, in order


# -- Prose openings ------------------------------------------------------------------------------

_CHARACTERS = ["an old clockmaker", "a young sailor", "a shy librarian", "a retired astronaut",
               "a curious fox", "a baker who could not sleep", "two sisters", "a lonely robot",
               "a stubborn goat", "a painter with no colours left"]
_PLACES = ["in a village by the sea", "at the edge of a great forest", "on a crowded island",
           "in a city of bridges", "high in the mountains", "beside a quiet lake",
           "in a house with a hundred doors", "on a farm far from any road"]
_CITIES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Melbourne", "Oslo", "Lima", "Seoul",
           "Edinburgh", "Marrakesh"]
_PRODUCTS = ["electric kettle", "rain jacket", "e-reader", "standing desk", "camping tent",
             "mechanical keyboard", "bicycle helmet", "blender"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
_MONTHS = ["January", "March", "May", "July", "September", "November"]
_ESSAYS = ["cities should have more trees", "everyone should learn a second language",
           "homework has real value", "public libraries matter more than ever",
           "slow travel is better than fast travel", "failure is a good teacher",
           "sport belongs in every school day", "small shops make a neighbourhood"]


def prose_prompts(rng: random.Random) -> list[str]:
    """Openings of plain text for the target to continue, in a fixed order (`rng` fills in the
    dates). Topics are _TOPICS and the chat set's concepts; none names an EVAL_QUESTIONS topic."""
    concepts = _TOPICS + CONCEPTS
    out = [f"An introduction to {c}\n\n" for c in concepts]
    out += [f"{c[0].upper() + c[1:]} is one of the most" for c in concepts]
    out += [f"In this essay I will argue that {e}. " for e in _ESSAYS]
    out += [f"Once upon a time, {who} lived {where}. Every morning,"
            for who in _CHARACTERS for where in _PLACES]
    out += [f"{city}, {rng.choice(_MONTHS)} {rng.randint(1, 28)} - Officials announced on "
            f"{rng.choice(_DAYS)} that" for city in _CITIES for _ in range(3)]
    out += [f"Review: the {p}\n\nI bought this {p} a month ago, and" for p in _PRODUCTS]
    out += [f"Dear {name},\n\nI hope you are well. I am writing to tell you about"
            for name in ("Sam", "Grandma", "Professor Lee", "Ms. Okafor", "Tom and Priya")]
    out += [f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}\n\nDear diary, today I finally"
            for _ in range(12)]
    out += [f"A traveller's guide to {c}\n\n{c} is" for c in COUNTRIES + _CITIES]
    out += [f"Five things I learned from {a}\n\n1." for a in ACTIVITIES]
    out += [f"Chapter One\n\nThe first thing {who} noticed" for who in _CHARACTERS]
    return out


# -- The held-out rules --------------------------------------------------------------------------

def check_excluded(prompts: list[str], questions: list[str], made_here: list[str],
                   kept_out: list[str] = ()) -> None:
    """Raises ValueError unless `questions` (the chat questions) holds no held-out question,
    `made_here` (the wider set's questions and the prose openings) no word of a held-out
    question's topic (`EVAL_TOPIC_WORDS`), and `prompts` (every prompt's text) contains none of
    the texts `kept_out` (a bench's prompts, so that the bench measures unseen text). The chat
    set's own questions are kept apart from the held-out ones by construction
    (`chat_questions` asserts it)."""
    held = set(EVAL_QUESTIONS)
    topic = re.compile(r"\b(" + "|".join(map(re.escape, EVAL_TOPIC_WORDS)) + r")\b", re.I)
    for q in questions:
        if q in held:
            raise ValueError(f"a held-out question is in the prompt set: {q!r}")
    for text in made_here:
        if topic.search(text):
            raise ValueError(f"a prompt names a held-out question's topic: {text!r}")
    for text in prompts:
        for kept in kept_out:
            if kept in text:
                raise ValueError(f"a prompt contains the kept-out text {kept[:40]!r}")


# -- The built-in sets ----------------------------------------------------------------------------

# name -> (rendered in the target's chat template, what it is)
BUILTIN = {
    "chat": (True, "709 questions from templates (chat_questions), then the 10 EVAL_QUESTIONS"),
    "chat-wide": (True, "chat's questions and 2,408 more on other topics and tasks "
                        "(more_chat_questions: code in 8 languages, writing, advice, words, "
                        "edits, people, animals, word problems), then the 10 EVAL_QUESTIONS"),
    "code": (False, "600 prompts cut from this Python's standard library, training files only "
                    "(specjax.train.stdlib.code_prompts: a function's signature and docstring, "
                    "a module's head, an edit instruction before the edited function)"),
    "prose": (False, "plain-text openings to continue (prose_prompts: articles, essays, "
                     "stories, news, reviews, letters, diaries, guides, lists)"),
}
CODE_PROMPTS = 600


def builtin(name: str) -> list[str]:
    """The prompts of a built-in set (`BUILTIN` names them, and says which are chat questions,
    to be rendered in the target's chat template, and which plain text to continue)."""
    if name == "chat":
        return chat_questions() + EVAL_QUESTIONS
    if name == "chat-wide":
        return list(dict.fromkeys(chat_questions() + more_chat_questions())) + EVAL_QUESTIONS
    if name == "code":
        return [text for _, text in stdlib.code_prompts(CODE_PROMPTS, seed=0)]
    if name == "prose":
        return prose_prompts(random.Random(0))
    raise ValueError(f"unknown built-in prompt set {name!r}: expected one of "
                     f"{', '.join(sorted(BUILTIN))}")
