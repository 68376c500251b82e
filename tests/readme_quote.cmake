# Checks that README.md quotes a program's marked block exactly, so the README's code is
# code that compiles and runs (the program is built and tested):
#   cmake -DREADME=README.md -DSOURCE=examples/x.cpp -P tests/readme_quote.cmake
# The block is the lines between "quotes from here ..." and "... to here." in SOURCE,
# less the indentation of its first line.
file(READ "${README}" readme)
file(READ "${SOURCE}" source)
string(FIND "${source}" "quotes from here ...\n" begin)
string(FIND "${source}" "// ... to here." end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "${SOURCE} has no block marked 'quotes from here ...' ... '// ... to here.'")
endif()
math(EXPR begin "${begin} + 21")
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${source}" ${begin} ${length} block)
string(REGEX MATCH "^ *" indent "${block}")
string(REGEX REPLACE "\n${indent}" "\n" block "\n${block}")
string(REGEX REPLACE "^\n" "" block "${block}")
string(REGEX REPLACE "\n *$" "\n" block "${block}")
string(FIND "${readme}" "${block}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not quote the block of ${SOURCE} as it is:\n${block}")
endif()
message(STATUS "README.md quotes ${SOURCE} as it is")
