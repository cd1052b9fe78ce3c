"""Real-text prompts for benchmarks/drafters/real.py, written for this project (nothing downloaded).

Three kinds, as users send them to a small chat model:
- chat: questions with free-form answers (drafts must predict the model; prompt lookup
  has little to copy);
- rewrite: rewrite, summarise or extract from a text in the prompt (the answer copies
  spans of the prompt, which prompt lookup exploits);
- code: write or edit code given in the prompt.
Each is one user message, sent through the model's chat template.
"""

CHAT = [
    "What are three good habits for staying healthy while working at a desk?",
    "Explain in simple words why the sky is blue.",
    "Give me a short recipe for a vegetable soup.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a small bakery and explain why it fits.",
    "How do I politely decline an invitation to a party?",
    "What should I pack for a weekend hiking trip?",
    "Why do cats purr?",
]

REWRITE = [
    "Rewrite the following paragraph in a formal tone:\n\nhey team, the meeting got moved to "
    "thursday at 3pm because the projector in room b is broken. bring your laptops and the "
    "sales numbers from last month. thanks!",
    "Summarise this in two sentences:\n\nThe city council met on Monday to discuss the new "
    "bicycle lanes on Main Street. Residents said the lanes made cycling safer, but several "
    "shop owners complained that they lost parking spaces in front of their stores. The "
    "council agreed to add a loading zone near the market and to review the lanes again "
    "in six months.",
    "Correct the spelling and grammar of this text and return the corrected text:\n\nI has "
    "went to the libary yesterday for borrow three book about the history of the roman "
    "empire, but the librarian say me that they was all checked out.",
    "Turn this list into a short paragraph:\n\n- The train leaves at 8:15.\n- Tickets cost 12 "
    "euros.\n- Bikes are allowed in the last carriage.\n- The trip takes two hours.",
    "Extract every date and what happens on it from this text, as a list:\n\nThe "
    "conference opens on 3 March with a keynote. Workshops run on 4 March and 5 March. "
    "The closing dinner is on 6 March, and the venue must be cleared by 7 March.",
    "Rewrite this email so that it is shorter but keeps every fact:\n\nDear Anna, I hope "
    "you are well. I am writing to let you know that the package you ordered on Tuesday "
    "has been shipped today by express mail and should arrive at your address on Friday "
    "morning. The tracking number is 44-1982-7731. Best regards, Paul",
    "Translate this sentence into French and then back into English:\n\nThe garden behind "
    "the old house is full of roses in June.",
    "Make this product description more exciting without changing the facts:\n\nThis "
    "backpack holds 25 litres, weighs 700 grams, has two side pockets and a padded laptop "
    "sleeve, and is made of recycled polyester.",
]

CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Add type hints and a docstring to this function:\n\ndef area(width, height):\n    "
    "return width * height",
    "Rename the variable `x` to `total` in this code and return the whole code:\n\ndef "
    "add_all(numbers):\n    x = 0\n    for n in numbers:\n        x = x + n\n    return x",
    "Write a Python function that checks whether a string is a palindrome.",
    "Fix the bug in this code and return the fixed code:\n\ndef average(values):\n    "
    "return sum(values) / len(value)",
    "Convert this loop into a list comprehension:\n\nsquares = []\nfor i in range(10):\n    "
    "squares.append(i * i)",
    "Write a SQL query that returns the ten most recent orders from a table `orders` with "
    "columns id, customer, created_at.",
    "Explain what this code does:\n\nwith open('data.txt') as f:\n    lines = [l.strip() for l "
    "in f if l.strip()]\nprint(len(lines))",
]

PROMPTS = {"chat": CHAT, "rewrite": REWRITE, "code": CODE}
