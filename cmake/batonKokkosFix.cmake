# Debian 12's Kokkos 3.4 (libtrilinos-kokkos-dev) exports Kokkos::kokkos with the include
# directory "<prefix>/lib/include", which does not exist; its headers are in
# Kokkos_INCLUDE_DIRS (/usr/include/trilinos). Any consumer that links Kokkos::kokkos then
# fails at generate time ("non-existent path"). This function, called right after
# find_package(Kokkos), drops include directories that do not exist from Kokkos's imported
# targets and adds Kokkos_INCLUDE_DIRS instead. A correct Kokkos (4.x, or a fixed 3.x) has
# no such entries and is left untouched. Installed with baton so that consumers get the
# same repair from find_package(baton COMPONENTS kokkos).
function(baton_fix_kokkos_targets)
  foreach(target IN ITEMS Kokkos::kokkos Kokkos::kokkoscore Kokkos::kokkoscontainers
                          Kokkos::kokkosalgorithms trilinos_kokkoscore
                          trilinos_kokkoscontainers trilinos_kokkosalgorithms)
    if(NOT TARGET ${target})
      continue()
    endif()
    get_target_property(aliased ${target} ALIASED_TARGET)
    if(aliased)
      continue()
    endif()
    get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT dirs)
      continue()
    endif()
    set(kept "")
    set(dropped FALSE)
    foreach(dir IN LISTS dirs)
      if(dir MATCHES "^\\$<" OR EXISTS "${dir}")
        list(APPEND kept "${dir}")
      else()
        set(dropped TRUE)
      endif()
    endforeach()
    if(dropped)
      foreach(dir IN LISTS Kokkos_INCLUDE_DIRS)
        get_filename_component(dir "${dir}" REALPATH)
        if(EXISTS "${dir}")
          list(APPEND kept "${dir}")
        endif()
      endforeach()
      list(REMOVE_DUPLICATES kept)
      set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${kept}")
      message(VERBOSE "baton: repaired include directories of ${target}: ${kept}")
    endif()
  endforeach()
endfunction()
