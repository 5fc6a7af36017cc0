"""Board and puzzle games on a grid: Sokoban, FrozenLake, 2048, Sudoku, Rubik's Cube."""
