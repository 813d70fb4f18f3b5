"""Word lists the pair verifier's vetoes read: English function words, negations, antonyms,
synonyms, units, dates and the words that change a question's scope.

Hand-written and general on purpose: the verifier must hold on questions nobody wrote a
template for, so these are lists of the language, not of our pair set. Corpus statistics
(how rare a word is, whether it is usually capitalised) come from the trained artifact.
"""


def word_list(text: str) -> list[str]:
    """A word list written as one string (shorter to read than a list of strings)."""
    return text.split()


# Words that carry no content of their own: a pair differing only in these is the same ask.
STOPWORDS = frozenset(
    word_list(
        """a an the of to in on at for from by with about as into onto over under than then and or
        but if so because while though although whether is am are was were be been being do does
        did done doing have has had having can could would will shall should may might must need
        needs i me my mine myself you your yours yourself we us our ours it its itself he him
        his she her they them their this that these those there here what how which who whom
        whose when where why please pls plz kindly hey hi hello thanks thank thx ok okay hmm
        well just really actually basically exactly simply also too very quite pretty some any
        anything something thing things stuff lot lots much many tell know let give show want
        wondering wonder help question quick curious way ways possible possibly maybe perhaps
        get got like mean means one ones someone anyone people person up out down off again
        still yet even ever already now"""
    )
)
# Inside STOPWORDS but not free to drop: up/down/off/out flip a phrasal verb's meaning, and
# they are checked by the antonym veto before content alignment ignores them.
PARTICLES = frozenset({"up", "down", "on", "off", "in", "out", "over", "under"})

NEGATIONS = frozenset(
    {
        "not",
        "no",
        "never",
        "none",
        "nobody",
        "nothing",
        "neither",
        "nor",
        "without",
        "cannot",
        "nowhere",
    }
)

# "can't" -> "can not" before tokenising, so negation and alignment see one form.
CONTRACTIONS = {
    "can't": "can not",
    "cannot": "can not",
    "won't": "will not",
    "shan't": "shall not",
    "n't": " not",
    "'re": " are",
    "'ll": " will",
    "'ve": " have",
    "'m": " am",
    "'d": " would",
    "what's": "what is",
    "where's": "where is",
    "who's": "who is",
    "how's": "how is",
    "that's": "that is",
    "there's": "there is",
    "it's": "it is",
    "let's": "let us",
    # typed without the apostrophe; not "cant", "wont", "shant": words of their own
    **{
        f"{verb}nt": f"{verb} not"
        for verb in word_list(
            "is are was were has have had do does did would should could must need"
        )
    },
    "w/o": "without",
}

# Pairs of opposites; either order. Prefix opposites (enable/disable, install/uninstall)
# are found by rule in pair_features, not listed here.
_ANTONYM_PAIRS = """
add remove|add delete|add subtract|plus minus|increase decrease|increase reduce|raise lower
higher lower|high low|more less|more fewer|most least|max min|maximum minimum|big small
large small|bigger smaller|larger smaller|biggest smallest|largest smallest|long short
longer shorter|longest shortest|tall short|taller shorter|fast slow|faster slower
fastest slowest|quick slow|early late|earlier later|earliest latest|before after|first last
start end|start stop|begin end|open close|opened closed|on off|up down|upper lower
in out|inside outside|into out|internal external|import export|include exclude
input output|upload download|push pull|send receive|buy sell|bought sold|rent buy
lend borrow|give take|win lose|won lost|winner loser|gain loss|profit loss|pass fail
true false|yes no|right wrong|right left|correct incorrect|good bad|better worse|best worst
positive negative|pros cons|advantage disadvantage|advantages disadvantages|benefit drawback
hot cold|warm cool|warmer cooler|hotter colder|heat cool|wet dry|light dark|light heavy
lighter heavier|hard soft|hard easy|harder easier|hardest easiest|difficult easy
cheap expensive|cheaper pricier|cheapest priciest|rich poor|strong weak|stronger weaker
safe dangerous|safe unsafe|healthy unhealthy|old new|older newer|oldest newest|old young
young old|ancient modern|past future|north south|east west|northern southern
eastern western|male female|man woman|men women|boy girl|husband wife|father mother
son daughter|brother sister|king queen|day night|morning evening|summer winter
spring autumn|spring fall|love hate|like dislike|agree disagree|accept reject|allow deny
allow block|allow forbid|permit forbid|enable disable|activate deactivate|connect disconnect
encrypt decrypt|encode decode|compress decompress|serialize deserialize|zip unzip
install uninstall|mount unmount|lock unlock|freeze unfreeze|follow unfollow|subscribe unsubscribe
show hide|visible hidden|public private|online offline|sync async|synchronous asynchronous
static dynamic|mutable immutable|local remote|local global|client server|frontend backend
front back|top bottom|above below|over under|horizontal vertical|row column|rows columns
ascending descending|asc desc|sort unsort|expand collapse|zoom shrink|maximize minimize
attack defend|offense defense|offensive defensive|import export|inbound outbound
inflow outflow|income expense|income expenses|credit debit|asset liability|assets liabilities
bull bear|bullish bearish|buyer seller|employer employee|teacher student|parent child
before after|cause effect|question answer|always never|everyone nobody|all none
everything nothing|often rarely|many few|increase drop|rise fall|rising falling|grow shrink
gained lost|add drop|join leave|arrive depart|arrival departure|enter exit|entry exit
import export|push pop|read write|reader writer|get set|getter setter|encode decode
max min|plus minus|multiply divide|multiplication division|addition subtraction
sum difference|odd even|prime composite|inner outer|left right|forward backward
forwards backwards|ahead behind|upstream downstream|uppercase lowercase|capital lowercase
""".replace("\n", "|")
ANTONYMS: dict[str, frozenset[str]] = {}
for _pair in filter(None, (p.strip() for p in _ANTONYM_PAIRS.split("|"))):
    _a, _b = _pair.split()
    ANTONYMS[_a] = ANTONYMS.get(_a, frozenset()) | {_b}
    ANTONYMS[_b] = ANTONYMS.get(_b, frozenset()) | {_a}

# Prefix pairs that turn a word into its opposite: enable/disable, import/export.
OPPOSITE_PREFIXES = (
    ("", "un"),
    ("", "dis"),
    ("", "non"),
    ("", "de"),
    ("", "anti"),
    ("", "in"),
    ("", "im"),
    ("", "il"),
    ("", "ir"),
    ("", "mis"),
    ("en", "dis"),
    ("en", "de"),
    ("in", "de"),
    ("in", "ex"),
    ("im", "ex"),
    ("in", "out"),
    ("up", "down"),
    ("over", "under"),
    ("pre", "post"),
    ("max", "min"),
    ("inc", "dec"),
    ("on", "off"),
    ("im", "de"),
    ("over", "under"),
    ("super", "sub"),
    ("intra", "inter"),
    ("micro", "macro"),
)
OPPOSITE_SUFFIXES = (("ful", "less"), ("er", "est"))

# Synonyms that paraphrases swap freely; each group maps to its first word.
_SYNONYM_GROUPS = """
make create build generate produce craft construct
fix repair resolve solve troubleshoot debug
error bug issue problem glitch
explain describe clarify elaborate
show display print output
fetch obtain retrieve grab acquire get
fast quick rapid speedy quickly rapidly swiftly
biggest largest
smallest tiniest
calculate compute
learn study
kill terminate
cheap inexpensive affordable
drawback disadvantage downside
benefit advantage
big large huge enormous
small little tiny
use utilize employ leverage
start begin launch initiate commence
finish complete
delete remove erase
buy purchase
help assist support
need require
choose pick select
tip advice suggestion recommendation hint
method approach technique way
write compose
convert transform turn translate
job work occupation career
movie film
car automobile vehicle
kid child
doctor physician
phone smartphone cellphone
picture image photo photograph
begin start
idea concept notion
program application app software
website site webpage
correct right accurate
answer reply response respond
example sample instance
step instruction
fail crash
modify change alter edit update
find locate discover search
cost price
test check verify validate
purpose goal aim objective
autumn fall
best ideal optimal good
summary summarise summarize synopsis recap
world earth globe
usa america
uk britain
macos mac osx
latest newest last
short brief
all every
colour color
favourite favorite
centre center
metre meter
kilometre kilometer
litre liter
organise organize
realise realize
analyse analyze
behaviour behavior
neighbour neighbor
grey gray
theatre theater
licence license
""".strip().splitlines()
SYNONYMS: dict[str, str] = {}
for _line in _SYNONYM_GROUPS:
    _group = _line.split()
    for _w in _group:
        SYNONYMS.setdefault(_w, _group[0])

# Units of measure and currencies; each spelling maps to one unit.
_UNIT_GROUPS = """
km kilometer kilometre kilometers kilometres
mi mile miles
m meter metre meters metres
cm centimeter centimeters centimetre centimetres
mm millimeter millimeters
ft foot feet
in inch inches
yd yard yards
kg kilogram kilograms kilo kilos
g gram grams
lb lbs pound pounds
oz ounce ounces
l liter liters litre litres
ml milliliter milliliters
gal gallon gallons
c celsius centigrade
f fahrenheit
k kelvin
s sec second seconds
min minute minutes
h hr hour hours
day days
week weeks
month months
year years yr yrs
decade decades
century centuries
mph
kph kmh
usd dollar dollars $
eur euro euros €
gbp sterling £
jpy yen ¥
inr rupee rupees
% percent percentage
b byte bytes
kb kilobyte kilobytes
mb megabyte megabytes
gb gigabyte gigabytes
tb terabyte terabytes
w watt watts
kw kilowatt kilowatts
kwh
v volt volts
hz hertz
ghz gigahertz
mhz megahertz
cal calorie calories
kcal
""".strip().splitlines()
UNITS: dict[str, str] = {}
for _line in _UNIT_GROUPS:
    _group = _line.split()
    for _w in _group:
        UNITS.setdefault(_w, _group[-1])
# Single letters are units only right after a number ("5 m", "30 c"); see pair_features.
AMBIGUOUS_UNITS = frozenset(w for w in UNITS if len(w) == 1 or w in {"in", "min", "day"})

# Not "may", "march": usually no dates; seasons are opposites in ANTONYMS instead.
DATES = frozenset(
    word_list(
        """january february april june july august september october november december jan feb apr
        jun jul aug sept oct nov monday tuesday wednesday thursday friday saturday sunday today
        tomorrow yesterday tonight weekend weekday morning afternoon evening night noon midnight
        christmas easter"""
    )
)

NUMBER_WORDS = {
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "eleven": "11",
    "twelve": "12",
    "thirteen": "13",
    "fourteen": "14",
    "fifteen": "15",
    "sixteen": "16",
    "seventeen": "17",
    "eighteen": "18",
    "nineteen": "19",
    "twenty": "20",
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "sixty": "60",
    "seventy": "70",
    "eighty": "80",
    "ninety": "90",
    "hundred": "100",
    "thousand": "1000",
    "million": "1000000",
    "billion": "1000000000",
    "dozen": "12",
    "half": "0.5",
    "quarter": "0.25",
    "twice": "x2",
    "double": "x2",
    "triple": "x3",
    "once": "x1",
    "first": "#1",
    "second": "#2",
    "third": "#3",
    "fourth": "#4",
    "fifth": "#5",
    "sixth": "#6",
    "seventh": "#7",
    "eighth": "#8",
    "ninth": "#9",
    "tenth": "#10",
    "last": "#-1",
}
# The number words that spell whole numbers, with their values ("ninety-one": 90 + 1).
CARDINALS = {w: int(v) for w, v in NUMBER_WORDS.items() if v.isdigit() and w not in ("dozen",)}
# "one" is usually a pronoun ("which one"); counted as a number only next to a noun-less
# context is guesswork, so it is left to alignment instead.
WEAK_NUMBER_WORDS = frozenset({"one", "second", "once", "double", "last"})

# Words that narrow or redirect what answer is wanted: audience, format, length, quantity,
# platform. One present on one side only means another answer.
SCOPE_WORDS = frozenset(
    word_list(
        """beginner beginners novice expert experts advanced intermediate professional
        professionals kid kids child children teen teenager teenagers adult adults student
        students senior seniors junior juniors developer developers manager managers list
        summarize summary summarise table bullet bullets outline essay poem story song haiku
        joke tweet email letter function class diagram chart graph example examples short brief
        concise detailed detail long longer shorter sentence sentences paragraph paragraphs word
        words page pages line lines pros cons all every only each both either none most least
        best worst top bottom cheapest fastest easiest hardest biggest smallest largest highest
        lowest free paid online offline mobile desktop web formal informal funny serious polite
        rude history future past present current latest recent stepwise"""
    )
)
