"""Print the README's map of course_lib, one row per chapter, from
``course_lib.CHAPTERS`` (``tests/test_layering.py`` checks the README
holds exactly this table)."""
import course_lib


def main() -> None:
    print("| Chapter | Modules |")
    print("|---|---|")
    for ch, mods in course_lib.CHAPTERS.items():
        cells = "; ".join(f"`{m}` ({what})" for m, what in mods.items())
        print(f"| {ch} | {cells} |")


if __name__ == "__main__":
    main()
