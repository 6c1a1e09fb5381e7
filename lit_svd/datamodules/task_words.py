"""Word lists and templates of the three prompt tasks (IOI, gender pronoun, greater-than).

Written for this project in the published structure of each task. Slots are written ``{name}``;
no slot opens a template (a name there would lack its leading
space); every name, pronoun and answer is later filtered to those that are ONE token in the tokenizer in use
(with the leading space), see ``lit_svd.datamodules.tasks``.
"""
from __future__ import annotations

MALE_NAMES = (
    "John", "James", "Robert", "Michael", "David", "William", "Richard", "Thomas", "Charles", "Daniel",
    "Matthew", "Anthony", "Mark", "Paul", "Steven", "Andrew", "Kevin", "Brian", "George", "Edward",
    "Ryan", "Jacob", "Gary", "Eric", "Jonathan", "Stephen", "Larry", "Justin", "Scott", "Frank",
    "Peter", "Samuel", "Henry", "Patrick", "Jack", "Dennis", "Jerry", "Tyler", "Aaron", "Adam",
    "Nathan", "Zachary", "Walter", "Kyle", "Harold", "Carl", "Jeremy", "Keith", "Roger", "Arthur",
    "Sean", "Christian", "Austin", "Joe", "Albert", "Bruce", "Ralph", "Roy", "Louis", "Philip",
    "Bobby", "Johnny", "Billy", "Martin", "Simon", "Oliver", "Leo", "Max", "Alex", "Victor",
)

FEMALE_NAMES = (
    "Mary", "Patricia", "Jennifer", "Linda", "Elizabeth", "Barbara", "Susan", "Jessica", "Sarah", "Karen",
    "Lisa", "Nancy", "Sandra", "Ashley", "Emily", "Donna", "Michelle", "Carol", "Amanda", "Melissa",
    "Deborah", "Stephanie", "Rebecca", "Laura", "Sharon", "Cynthia", "Kathleen", "Amy", "Angela", "Anna",
    "Helen", "Emma", "Nicole", "Samantha", "Katherine", "Christine", "Rachel", "Catherine", "Maria", "Heather",
    "Julie", "Olivia", "Joyce", "Victoria", "Kelly", "Lauren", "Christina", "Joan", "Evelyn", "Judith",
    "Megan", "Andrea", "Hannah", "Jacqueline", "Martha", "Gloria", "Teresa", "Sara", "Julia", "Grace",
    "Alice", "Diana", "Ruth", "Jane", "Lucy", "Rose", "Anne", "Kate", "Claire", "Sophie",
)

# --- IOI: "When {n1} and {n2} went to the {place}, {s} gave {object} to" -> the name that is not {s}.
# {n1}, {n2} are (IO, S) in ABBA order and (S, IO) in BABA order; {s} is the subject, repeated.
IOI_TEMPLATES = (
    "When {n1} and {n2} went to the {place}, {s} gave {object} to",
    "After {n1} and {n2} arrived at the {place}, {s} handed {object} to",
    "While {n1} and {n2} were waiting at the {place}, {s} passed {object} to",
    "Then, {n1} and {n2} spent the afternoon at the {place}. {s} offered {object} to",
    "Last week {n1} and {n2} met at the {place}. Later, {s} handed {object} to",
    "Yesterday {n1} and {n2} had lunch at the {place}, and {s} gave {object} to",
    "On Sunday {n1} and {n2} walked to the {place}. Later {s} gave {object} to",
    "When {n1} and {n2} got back from the {place}, {s} handed {object} to",
    "Today {n1} and {n2} were cleaning the {place} together. Afterwards {s} lent {object} to",
    "Because {n1} and {n2} were late to the {place}, {s} gave {object} to",
    "At the {place}, {n1} and {n2} talked for hours, and then {s} gave {object} to",
    "After a long day at the {place}, {n1} and {n2} sat down. {s} gave {object} to",
    "Once {n1} and {n2} had found the {place}, {s} passed {object} to",
    "As {n1} and {n2} were leaving the {place}, {s} handed {object} to",
    "Before {n1} and {n2} went to the {place}, {s} mailed {object} to",
    "Since {n1} and {n2} both work at the {place}, {s} delivered {object} to",
)

PLACES = (
    "store", "park", "school", "hospital", "station", "restaurant", "office", "garden", "library", "market",
    "beach", "museum", "airport", "bakery", "church", "theater", "gym", "harbor", "farm", "bank",
)

OBJECTS = (  # no "X to the ..." collocations (a key / ticket / letter / map to the ...)
    "a drink", "a book", "a flower", "a sandwich", "an apple", "a bag", "a pencil", "a cookie", "a basketball",
    "a necklace", "a candle", "a blanket", "a snack", "a computer", "a hat", "a present", "a coin", "a towel",
    "a cake", "a phone",
)

# --- Gender pronoun: the next token is the pronoun of {name}; the corrupted prompt swaps in a name
# of the other gender.
GP_TEMPLATES = (
    "So {name} is a very {adj} person, isn't",
    "Today {name} seemed {adj}. I asked what was wrong, and",
    "My friend {name} is really {adj}. Yesterday,",
    "After the meeting {name} looked {adj}, so I asked if",
    "Our neighbour {name} is very {adj}. Every morning",
    "Because {name} was feeling {adj},",
    "I think {name} is {adj}, but nobody knows whether",
    "Everyone agrees that {name} is {adj}, because",
)

GP_ADJECTIVES = (
    "kind", "happy", "quiet", "tired", "busy", "friendly", "clever", "calm", "nervous", "funny",
    "brave", "proud", "honest", "strange", "lonely", "careful", "polite", "serious", "gentle", "curious",
)

PRONOUNS = {"male": "he", "female": "she"}

# --- Greater-than: "The {noun} lasted from the year {century}{start} to the year {century}" -> a
# two-digit end year above {start}. The corrupted prompt sets {start} to "01".
GT_TEMPLATES = (
    "The {noun} lasted from the year {century}{start} to the year {century}",
    "The {noun} began in the year {century}{start} and ended in the year {century}",
    "The {noun} went on from the year {century}{start} until the year {century}",
)

GT_NOUNS = (
    "war", "drought", "famine", "expedition", "dynasty", "pilgrimage", "occupation", "reign", "rebellion",
    "plague", "siege", "voyage", "alliance", "treaty", "crisis", "revolution", "campaign", "empire",
    "conflict", "journey",
)

GT_CENTURIES = tuple(range(11, 19))  # 1100s .. 1800s
GT_START_YEARS = tuple(range(2, 99))  # two-digit start years 02 .. 98
GT_CORRUPT_START = 1  # "01"
