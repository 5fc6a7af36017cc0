"""The words the generated WebShop catalogue (:func:`envs.tools.webshop.catalogue.generate_catalogue`)
is made of: its five categories, each with its WebShop-like top level, its attribute pool and its
product types (subcategory, option groups and their values, price range); the syllables of brand
names, the tails of product titles and the openings of instructions.

The generator draws from these tables in the order written here, so editing, adding or reordering
an entry changes the catalogue of every seed; warm starts built on the old one are then not reused
(this module is part of the WebShop env's code fingerprint, ``ragen_lightning/sft/fingerprint.py``)."""

from __future__ import annotations

COLORS = (
    "black",
    "white",
    "grey",
    "blue",
    "red",
    "green",
    "pink",
    "brown",
    "beige",
    "navy",
    "silver",
    "purple",
)
_CLOTHING_SIZES = ("small", "medium", "large", "x-large")
_CABLE_LENGTHS = ("3 ft", "6 ft", "10 ft")
# category -> (WebShop-like top level, attribute pool, [(type, subcategory, option groups, price
# range)])
CATEGORIES: dict[
    str,
    tuple[
        str,
        tuple[str, ...],
        tuple[tuple[str, str, dict[str, tuple[str, ...]], tuple[float, float]], ...],
    ],
] = {
    "beauty": (
        "Beauty & Personal Care",
        (
            "long lasting",
            "natural looking",
            "paraben free",
            "sulfate free",
            "cruelty free",
            "travel size",
            "easy to use",
            "hypoallergenic",
            "vegan",
            "fragrance free",
            "dermatologist tested",
            "waterproof",
        ),
        (
            (
                "hair extension",
                "Hair Care",
                {
                    "color": ("black", "brown", "blonde", "red"),
                    "size": ("14 inch", "18 inch", "22 inch"),
                },
                (15, 60),
            ),
            ("shampoo", "Hair Care", {"size": ("8 fl oz", "12 fl oz", "16 fl oz")}, (6, 30)),
            ("face serum", "Skin Care", {"size": ("1 fl oz", "2 fl oz")}, (10, 45)),
            ("lipstick", "Makeup", {"color": ("red", "pink", "nude", "coral", "plum")}, (5, 25)),
            (
                "nail polish",
                "Makeup",
                {"color": ("red", "pink", "nude", "black", "purple")},
                (4, 18),
            ),
            (
                "body lotion",
                "Skin Care",
                {
                    "scent": ("lavender", "coconut", "unscented", "vanilla"),
                    "size": ("8 fl oz", "16 fl oz"),
                },
                (6, 28),
            ),
            ("hair dryer", "Hair Care", {"color": ("black", "white", "pink")}, (20, 90)),
            ("makeup brush set", "Makeup", {"color": ("black", "rose gold", "white")}, (8, 40)),
        ),
    ),
    "electronics": (
        "Electronics",
        (
            "fast charging",
            "water resistant",
            "noise cancelling",
            "long battery life",
            "easy to install",
            "high speed",
            "portable",
            "lightweight",
            "usb c",
            "wireless",
            "shockproof",
            "dustproof",
        ),
        (
            ("wireless earbuds", "Headphones", {"color": ("black", "white", "blue")}, (20, 120)),
            (
                "bluetooth speaker",
                "Portable Audio",
                {"color": ("black", "blue", "red", "grey")},
                (18, 110),
            ),
            (
                "phone case",
                "Cell Phone Accessories",
                {"color": COLORS[:8], "size": ("iphone 13", "iphone 14", "iphone 15")},
                (6, 30),
            ),
            (
                "charging cable",
                "Cables",
                {"color": ("black", "white"), "length": _CABLE_LENGTHS},
                (5, 20),
            ),
            (
                "power bank",
                "Cell Phone Accessories",
                {"capacity": ("10000mah", "20000mah", "26800mah")},
                (15, 60),
            ),
            (
                "laptop stand",
                "Computer Accessories",
                {"color": ("silver", "black", "grey")},
                (15, 55),
            ),
            ("hdmi cable", "Cables", {"length": _CABLE_LENGTHS}, (6, 25)),
            (
                "smart watch band",
                "Wearable Technology",
                {"color": COLORS[:6], "size": ("38mm", "42mm", "45mm")},
                (5, 25),
            ),
        ),
    ),
    "fashion": (
        "Clothing, Shoes & Jewelry",
        (
            "machine washable",
            "slim fit",
            "relaxed fit",
            "long sleeve",
            "short sleeve",
            "moisture wicking",
            "quick drying",
            "non slip",
            "breathable",
            "cotton",
            "button closure",
            "elastic waist",
        ),
        (
            (
                "running shoes",
                "Shoes",
                {"color": ("black", "white", "grey", "blue"), "size": ("7", "8", "9", "10", "11")},
                (30, 110),
            ),
            ("t-shirt", "Tops & Tees", {"color": COLORS[:8], "size": _CLOTHING_SIZES}, (8, 30)),
            (
                "hoodie",
                "Sweatshirts",
                {"color": ("black", "grey", "navy", "green"), "size": _CLOTHING_SIZES},
                (20, 60),
            ),
            (
                "jeans",
                "Pants",
                {
                    "color": ("blue", "black", "grey"),
                    "size": ("30w x 30l", "32w x 32l", "34w x 32l"),
                },
                (25, 80),
            ),
            (
                "sneakers",
                "Shoes",
                {"color": ("white", "black", "red"), "size": ("7", "8", "9", "10")},
                (35, 120),
            ),
            (
                "summer dress",
                "Dresses",
                {"color": ("red", "blue", "pink", "white", "green"), "size": _CLOTHING_SIZES},
                (18, 70),
            ),
            (
                "winter jacket",
                "Coats & Jackets",
                {"color": ("black", "navy", "green", "beige"), "size": _CLOTHING_SIZES},
                (45, 180),
            ),
            (
                "athletic socks",
                "Socks",
                {"color": ("white", "black", "grey"), "size": ("medium", "large")},
                (7, 22),
            ),
        ),
    ),
    "grocery": (
        "Grocery & Gourmet Food",
        (
            "gluten free",
            "sugar free",
            "low carb",
            "non gmo",
            "organic",
            "keto friendly",
            "high protein",
            "individually wrapped",
            "ready to eat",
            "low sodium",
            "dairy free",
            "kosher",
        ),
        (
            (
                "coffee beans",
                "Coffee",
                {
                    "flavor": ("original", "vanilla", "hazelnut", "mocha"),
                    "size": ("12 ounce", "2 pound"),
                },
                (8, 35),
            ),
            (
                "green tea",
                "Tea",
                {
                    "flavor": ("original", "mint", "jasmine", "lemon"),
                    "size": ("20 count", "100 count"),
                },
                (5, 25),
            ),
            (
                "protein bar",
                "Snacks",
                {
                    "flavor": ("chocolate", "peanut butter", "vanilla", "cookie dough"),
                    "size": ("12 count", "24 count"),
                },
                (15, 45),
            ),
            (
                "dark chocolate",
                "Candy",
                {
                    "flavor": ("original", "sea salt", "mint", "orange"),
                    "size": ("3.5 ounce", "pack of 6"),
                },
                (4, 30),
            ),
            (
                "trail mix",
                "Snacks",
                {
                    "flavor": ("original", "tropical", "sweet and salty"),
                    "size": ("10 ounce", "26 ounce"),
                },
                (6, 22),
            ),
            (
                "olive oil",
                "Cooking Oils",
                {"size": ("16.9 fl oz", "33.8 fl oz", "1 gallon")},
                (9, 45),
            ),
            (
                "hot sauce",
                "Condiments",
                {"flavor": ("habanero", "chipotle", "original"), "size": ("5 fl oz", "pack of 3")},
                (4, 20),
            ),
            (
                "granola",
                "Breakfast Foods",
                {
                    "flavor": ("honey almond", "berry", "cinnamon"),
                    "size": ("11 ounce", "pack of 4"),
                },
                (5, 28),
            ),
        ),
    ),
    "furniture": (
        "Home & Kitchen",
        (
            "easy to assemble",
            "solid wood",
            "mid century",
            "living room",
            "space saving",
            "heavy duty",
            "height adjustable",
            "storage space",
            "metal frame",
            "non slip",
            "stain resistant",
            "modern",
        ),
        (
            (
                "office chair",
                "Home Office Furniture",
                {"color": ("black", "grey", "white", "blue")},
                (60, 250),
            ),
            (
                "bookshelf",
                "Living Room Furniture",
                {"color": ("walnut", "white", "black", "natural")},
                (40, 200),
            ),
            (
                "coffee table",
                "Living Room Furniture",
                {"color": ("walnut", "black", "natural")},
                (50, 220),
            ),
            (
                "bed frame",
                "Bedroom Furniture",
                {"color": ("black", "grey", "walnut"), "size": ("twin", "full", "queen", "king")},
                (90, 400),
            ),
            (
                "throw pillow cover",
                "Decorative Pillows",
                {"color": COLORS[:9], "size": ("18x18 inch", "20x20 inch", "26x26 inch")},
                (8, 30),
            ),
            ("floor lamp", "Lighting", {"color": ("black", "white", "gold", "silver")}, (30, 140)),
            (
                "storage ottoman",
                "Living Room Furniture",
                {"color": ("grey", "beige", "brown", "navy")},
                (30, 120),
            ),
            (
                "bar stool",
                "Kitchen Furniture",
                {"color": ("black", "white", "walnut"), "size": ("24 inch", "30 inch")},
                (45, 180),
            ),
        ),
    ),
}
BRAND_SYLLABLES = (
    "ka",
    "lu",
    "mo",
    "ri",
    "ven",
    "sol",
    "ta",
    "no",
    "zen",
    "ar",
    "bel",
    "cor",
    "di",
    "el",
    "fa",
    "gri",
    "ho",
    "is",
    "jo",
    "mar",
    "ny",
    "pe",
    "qu",
    "sa",
    "tor",
    "ul",
    "vi",
    "wo",
    "xy",
    "yu",
)
TITLE_TAILS = (
    "",
    "",
    "for Women",
    "for Men",
    "2 Pack",
    "Set",
    "Premium",
    "Classic",
    "New Version",
    "Gift",
)
INSTRUCTION_LEADS = (
    "i need a",
    "i am looking for a",
    "find me a",
    "i want a",
    "i would like a",
    "can you find me a",
)

__all__ = [
    "BRAND_SYLLABLES",
    "CATEGORIES",
    "COLORS",
    "INSTRUCTION_LEADS",
    "TITLE_TAILS",
]
