"""What results look like outside: Arrow tables and files, text tables, plots, the HTML report."""
